//! Storage faults without network namespaces.
//!
//! - [`StorageProxy`]: on S3, each broker talks to the endpoint through its own TCP proxy in the
//!   harness process, so one broker at a time can be cut off from the storage, slowed down, or
//!   have its connections reset while the others (and the admin commands) reach it directly.
//! - [`Tmpfs`]: on the local backend, the shared storage lives on a small tmpfs the harness
//!   mounts, so the nemesis can fill it up (ENOSPC for every broker at once).
//!
//! Both register what they must undo in [`cleanup`], which also runs on SIGINT/SIGTERM.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::cleanup;

/// What a broker's proxy does with its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Forward,
    /// Every chunk waits this long before it is forwarded (both directions).
    Slow(Duration),
    /// Accepts connections and reads nothing, forwards nothing: a partition between the broker
    /// and the storage. Held bytes flow again once the mode changes, as after a healed link.
    Blackhole,
    /// Every connection, open or new, is reset (RST) as soon as it is seen.
    Reset,
}

/// One broker's proxy in front of the S3 endpoint.
pub struct StorageProxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
}

impl StorageProxy {
    /// Listens on a loopback port and forwards every connection to `upstream` (`host:port`).
    pub fn start(runtime: &tokio::runtime::Handle, upstream: String) -> std::io::Result<Self> {
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0"))?;
        let port = listener.local_addr()?.port();
        let (mode, watching) = watch::channel(Mode::Forward);
        let upstream = Arc::new(upstream);
        runtime.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let (upstream, watching) = (Arc::clone(&upstream), watching.clone());
                tokio::spawn(async move {
                    serve(client, &upstream, watching).await;
                });
            }
        });
        Ok(Self { port, mode })
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

async fn serve(client: TcpStream, upstream: &str, mut mode: watch::Receiver<Mode>) {
    // A blackholed broker's new connections are accepted but go nowhere until the link heals.
    loop {
        let now = *mode.borrow_and_update();
        match now {
            Mode::Reset => return reset(&client),
            Mode::Blackhole => {
                if mode.changed().await.is_err() {
                    return;
                }
            }
            Mode::Forward | Mode::Slow(_) => break,
        }
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return reset(&client);
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, mode.clone());
    let down = pump(server_read, client_write, mode);
    tokio::join!(up, down);
}

fn reset(stream: &TcpStream) {
    // SO_LINGER 0: the close sends RST, which the broker's HTTP client sees as a reset.
    let _ = stream.set_zero_linger();
}

/// Copies one direction chunk by chunk, applying the mode to each chunk.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                if *mode.borrow() == Mode::Reset {
                    return reset_halves(from, to);
                }
                continue;
            }
        };
        let n = match read {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        loop {
            let now = *mode.borrow_and_update();
            match now {
                Mode::Forward => break,
                Mode::Slow(delay) => {
                    tokio::time::sleep(delay).await;
                    break;
                }
                Mode::Reset => return reset_halves(from, to),
                Mode::Blackhole => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// Sets SO_LINGER 0 on both sockets of this direction (the read half's socket is one end, the
/// write half's the other), so dropping them resets both connections.
fn reset_halves(from: tokio::net::tcp::OwnedReadHalf, to: tokio::net::tcp::OwnedWriteHalf) {
    let _ = from.as_ref().set_zero_linger();
    let _ = to.as_ref().set_zero_linger();
}

/// The S3 URL's `endpoint=http://HOST:PORT` as `HOST:PORT`, if it has one.
pub fn s3_endpoint(url: &str) -> Option<String> {
    let (_, query) = url.split_once('?')?;
    let endpoint = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("endpoint="))?;
    let authority = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .unwrap_or(endpoint);
    Some(authority.trim_end_matches('/').to_string())
}

/// `url` with its endpoint replaced by `http://127.0.0.1:<port>`.
pub fn with_endpoint_port(url: &str, port: u16) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| {
            if pair.starts_with("endpoint=") {
                format!("endpoint=http://127.0.0.1:{port}")
            } else {
                pair.to_string()
            }
        })
        .collect();
    format!("{head}?{}", query.join("&"))
}

/// A tmpfs of `size_mib` mounted under a temporary directory; unmounted when dropped (and by
/// the signal handler).
pub struct Tmpfs {
    // Declared before `_parent` so the unmount happens before the directory is removed.
    mount: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size_mib: u64) -> Result<Self, String> {
        let parent = tempfile::Builder::new()
            .prefix("strata-harness-full-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?;
        let mount = parent.path().join("storage");
        std::fs::create_dir(&mount).map_err(|e| format!("create {}: {e}", mount.display()))?;
        let output = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(&mount)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "mount -t tmpfs on {}: {} (the full fault needs root)",
                mount.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        cleanup::register(cleanup::Undo::Unmount(mount.clone()));
        Ok(Self {
            mount,
            _parent: parent,
        })
    }

    pub fn path(&self) -> &Path {
        &self.mount
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let undo = cleanup::Undo::Unmount(self.mount.clone());
        undo.run();
        cleanup::unregister(&undo);
    }
}

/// Fills the file system holding `dir` with one file until the write fails (ENOSPC); returns
/// the file's path and how many bytes it got.
pub fn fill(dir: &Path) -> Result<(PathBuf, u64), String> {
    use std::io::Write;
    let path = dir.join("harness-filler");
    let mut file =
        std::fs::File::create(&path).map_err(|e| format!("create {}: {e}", path.display()))?;
    let chunk = vec![0xA5u8; 1024 * 1024];
    let mut written: u64 = 0;
    // Byte-sized writes at the end take the last pages, so the brokers really get ENOSPC.
    for size in [chunk.len(), 4096, 1] {
        while file.write_all(&chunk[..size]).is_ok() {
            written += size as u64;
        }
    }
    Ok((path, written))
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str =
        "s3://strata/test/run1?endpoint=http://127.0.0.1:9320&region=us-east-1&allow_http=true";

    #[test]
    fn the_endpoint_is_read_and_rewritten() {
        assert_eq!(s3_endpoint(URL).as_deref(), Some("127.0.0.1:9320"));
        assert_eq!(
            with_endpoint_port(URL, 4242),
            "s3://strata/test/run1?endpoint=http://127.0.0.1:4242&region=us-east-1&allow_http=true"
        );
        assert_eq!(s3_endpoint("file:///tmp/x"), None);
    }

    /// An upstream that echoes every byte back.
    async fn echo() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = socket.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn roundtrip(stream: &mut TcpStream, data: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(data).await?;
        let mut back = vec![0u8; data.len()];
        stream.read_exact(&mut back).await?;
        Ok(back)
    }

    #[test]
    fn the_proxy_forwards_holds_and_resets() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let upstream = runtime.block_on(echo());
        let proxy = StorageProxy::start(runtime.handle(), upstream).unwrap();
        let port = proxy.port;
        runtime.block_on(async {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            assert_eq!(roundtrip(&mut stream, b"one").await.unwrap(), b"one");

            // Held while blackholed, delivered once the link heals.
            proxy.set(Mode::Blackhole);
            stream.write_all(b"two").await.unwrap();
            proxy.set(Mode::Forward);
            let mut back = [0u8; 3];
            stream.read_exact(&mut back).await.unwrap();
            assert_eq!(&back, b"two");

            proxy.set(Mode::Slow(Duration::from_millis(1)));
            assert_eq!(roundtrip(&mut stream, b"three").await.unwrap(), b"three");

            // An open connection is reset, and so is a new one.
            proxy.set(Mode::Reset);
            assert!(roundtrip(&mut stream, b"four").await.is_err());
            // The reset can reach a new connection before its connect() call has returned.
            match TcpStream::connect(("127.0.0.1", port)).await {
                Ok(mut fresh) => assert!(roundtrip(&mut fresh, b"five").await.is_err()),
                Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
            }

            proxy.set(Mode::Forward);
            let mut healed = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            assert_eq!(roundtrip(&mut healed, b"six").await.unwrap(), b"six");
        });
    }
}
