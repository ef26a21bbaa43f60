// A seed server: net/http serving one file at any path, the two ways Go code does it.
//
// Usage: seed-go sendfile|copy PORT FILE. `sendfile` sets Content-Type and Content-Length, flushes
// the head and calls io.Copy(w, f): net/http's response.ReadFrom hands the *os.File to the TCP
// connection, which uses sendfile(2). `copy` calls io.Copy(w, struct{ io.Reader }{f}): the wrapper
// hides ReadFrom/WriterTo (as in Go CL 163599), so the bytes go through a 32 KiB read/write loop.
// Prints `ready` once it listens. Used by ebpf/probe/tests/seeds.rs and `cargo xtask demo --seeds`.
package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: seed-go sendfile|copy PORT FILE")
		os.Exit(2)
	}
	mode, port, path := os.Args[1], os.Args[2], os.Args[3]
	handler := func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(st.Size(), 10))
		if mode == "sendfile" {
			// The head goes out now, so net/http neither sniffs nor buffers the first bytes.
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			io.Copy(w, f)
		} else {
			io.Copy(w, struct{ io.Reader }{f})
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("ready")
	http.Serve(ln, http.HandlerFunc(handler))
}
