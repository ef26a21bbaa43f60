//! The TLS handshake on a new connection to an `https://` server of a group: within the group's
//! connect timeout, with the group's TLS settings ([`crate::tls::client`]), a failure recorded
//! against the server (kind `tls`) like a failed connect. A failed certificate verification is
//! told apart, so the client's 502 can say `detail=tls-verify`.

use super::error::UpstreamError;
use super::pool::Group;
use super::stream::UpstreamStream;
use tokio::net::TcpStream;

impl Group {
    /// The TLS handshake on a new connection to `https://` server `i`, within the connect
    /// timeout; a failure is recorded against the server (kind `tls`).
    pub(super) async fn handshake(
        &self,
        i: usize,
        tcp: TcpStream,
    ) -> Result<UpstreamStream, UpstreamError> {
        let peer = &self.peers[i];
        let fail = |error: String, verify: bool| {
            self.failed(i, "tls", &error);
            UpstreamError::Tls {
                server: peer.addr.clone(),
                error,
                verify,
            }
        };
        let tls = match &self.tls {
            Some(Ok(t)) => t,
            Some(Err(e)) => return Err(fail(e.clone(), false)),
            None => return Err(fail("no TLS settings for an https server".into(), false)),
        };
        let host = zerocache_config::tls::host_of(&peer.addr);
        match tokio::time::timeout(self.connect_timeout, tls.connect(tcp, host)).await {
            Ok(Ok(s)) => Ok(UpstreamStream::Tls(Box::new(s))),
            Ok(Err(e)) => {
                let verify = matches!(e, crate::tls::client::OriginTlsError::Verify(_));
                Err(fail(e.to_string(), verify))
            }
            Err(_) => Err(fail(
                format!("TLS handshake timed out after {:?}", self.connect_timeout),
                false,
            )),
        }
    }
}
