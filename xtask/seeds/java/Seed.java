// A seed server: HTTP/1.1 keep-alive, one file at any path, one connection at a time, the two
// ways Java code sends a file.
//
// Usage: java Seed transferTo|copy PORT FILE. `transferTo` accepts a SocketChannel and sends the
// body with FileChannel.transferTo (sendfile(2)); `copy` accepts a plain java.net.Socket and sends
// it with Files.copy(path, socket.getOutputStream()), which copies through a heap buffer. Tested
// with OpenJDK 17 (Debian's default-jdk-headless): newer JDKs add fast paths to transferTo.
// Prints `ready` once it listens. Used by ebpf/probe/tests/seeds.rs and `cargo xtask demo --seeds`.
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

public final class Seed {
    public static void main(String[] args) throws Exception {
        String mode = args[0];
        int port = Integer.parseInt(args[1]);
        Path path = Path.of(args[2]);
        long size = Files.size(path);
        byte[] head = ("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: "
                + size + "\r\n\r\n").getBytes(StandardCharsets.US_ASCII);
        InetSocketAddress addr = new InetSocketAddress("127.0.0.1", port);
        if (mode.equals("transferTo")) {
            ServerSocketChannel server = ServerSocketChannel.open();
            server.bind(addr);
            System.out.println("ready");
            System.out.flush();
            while (true) {
                try (SocketChannel ch = server.accept()) {
                    InputStream in = java.nio.channels.Channels.newInputStream(ch);
                    String request;
                    while ((request = readHead(in)) != null) {
                        ByteBuffer b = ByteBuffer.wrap(head);
                        while (b.hasRemaining()) {
                            ch.write(b);
                        }
                        try (FileChannel f = FileChannel.open(path, StandardOpenOption.READ)) {
                            long at = 0;
                            while (at < size) {
                                at += f.transferTo(at, size - at, ch);
                            }
                        }
                        if (request.contains("connection: close")) {
                            break;
                        }
                    }
                }
            }
        } else {
            ServerSocket server = new ServerSocket();
            server.bind(addr);
            System.out.println("ready");
            System.out.flush();
            while (true) {
                try (Socket s = server.accept()) {
                    InputStream in = s.getInputStream();
                    OutputStream out = s.getOutputStream();
                    String request;
                    while ((request = readHead(in)) != null) {
                        out.write(head);
                        Files.copy(path, out);
                        out.flush();
                        if (request.contains("connection: close")) {
                            break;
                        }
                    }
                }
            }
        }
    }

    /** The request head up to the blank line, lower-cased, or null at end of stream. */
    static String readHead(InputStream in) throws java.io.IOException {
        StringBuilder sb = new StringBuilder();
        int c;
        while ((c = in.read()) != -1) {
            sb.append((char) c);
            int n = sb.length();
            if (n >= 4 && sb.charAt(n - 4) == '\r' && sb.charAt(n - 3) == '\n'
                    && sb.charAt(n - 2) == '\r' && sb.charAt(n - 1) == '\n') {
                return sb.toString().toLowerCase();
            }
            if (n > 65536) {
                return null;
            }
        }
        return null;
    }
}
