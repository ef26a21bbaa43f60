//! The soak's HTTP/2 client: half the client threads speak h2 with prior knowledge to the same
//! listener (`h2c: true`), through the `h2` crate on a runtime of their own, so every check the
//! soak makes of HTTP/1.1 answers (bytes, ranges, 304s, HEAD) is made of h2 ones too. A stream
//! reset mid-body is a cut-short body whose received part is still checked.

use super::http::{IoFail, Response};
use super::*;
use bytes::Bytes;

pub(crate) struct H2Conn {
    rt: tokio::runtime::Runtime,
    send: ::h2::client::SendRequest<Bytes>,
}

impl H2Conn {
    pub(crate) fn connect(addr: SocketAddr) -> std::io::Result<H2Conn> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let send = rt.block_on(async {
            let tcp =
                tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(addr))
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
            tcp.set_nodelay(true)?;
            let (send, conn) = ::h2::client::handshake(tcp)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok::<_, std::io::Error>(send)
        })?;
        Ok(H2Conn { rt, send })
    }

    /// Sends the HTTP/1.1 request `req` (as the soak writes it) as an h2 request and reads the
    /// whole answer.
    pub(crate) fn exchange(&mut self, req: &[u8], _head_only: bool) -> Result<Response, IoFail> {
        let text = String::from_utf8_lossy(req);
        let mut lines = text.split("\r\n");
        let mut first = lines.next().unwrap_or("").split(' ');
        let (method, target) = (first.next().unwrap_or("GET"), first.next().unwrap_or("/"));
        let mut b = ::http::Request::builder().method(method);
        let mut host = HOST.to_string();
        for l in lines.filter(|l| !l.is_empty()) {
            let Some((k, v)) = l.split_once(':') else {
                continue;
            };
            match k.to_ascii_lowercase().as_str() {
                "host" => host = v.trim().to_string(),
                // Connection-specific: HTTP/2 forbids it (a new connection is the soak's doing).
                "connection" => {}
                k => b = b.header(k, v.trim()),
            }
        }
        let request = b
            .uri(format!("http://{host}{target}"))
            .body(())
            .map_err(|e| IoFail::Protocol(e.to_string()))?;
        let send = self.send.clone();
        self.rt.block_on(async move {
            match tokio::time::timeout(CLIENT_READ_TIMEOUT, exchange(send, request)).await {
                Ok(r) => r,
                Err(_) => Err(IoFail::Timeout("h2: no answer in time".into())),
            }
        })
    }
}

async fn exchange(
    send: ::h2::client::SendRequest<Bytes>,
    request: ::http::Request<()>,
) -> Result<Response, IoFail> {
    let mut send = send
        .ready()
        .await
        .map_err(|e| IoFail::BeforeHead(format!("h2: {e}")))?;
    let (answer, _) = send
        .send_request(request, true)
        .map_err(|e| IoFail::BeforeHead(format!("h2: {e}")))?;
    let answer = answer
        .await
        .map_err(|e| IoFail::BeforeHead(format!("h2: {e}")))?;
    let status = answer.status().as_u16();
    let headers = answer
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let mut body = answer.into_body();
    let mut got = Vec::new();
    while let Some(chunk) = body.data().await {
        match chunk {
            Ok(c) => {
                let _ = body.flow_control().release_capacity(c.len());
                got.extend_from_slice(&c);
            }
            Err(e) => return Err(IoFail::MidBody(format!("h2: {e}"), status, got)),
        }
    }
    Ok(Response {
        status,
        headers,
        body: got,
        keep: true,
    })
}
