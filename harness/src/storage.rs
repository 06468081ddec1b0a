//! Storage faults without network namespaces.
//!
//! - [`StorageProxy`]: on S3, each broker talks to the endpoint through its own TCP proxy in the
//!   harness process, so one broker at a time can be cut off from the storage, slowed down, or
//!   have its connections reset while the others (and the admin commands) reach it directly.
//! - [`RadosCut`]: on RADOS, librados talks to the monitor and to every OSD, so a proxy would
//!   have to rewrite the OSD map. Instead each broker runs under a group id of its own and
//!   iptables' owner match drops that broker's packets to the Ceph ports, while the others (and
//!   the admin commands, under the harness's group) reach the cluster directly.
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

/// Ceph's default range of OSD (and mgr) ports (`ms_bind_port_min`, `ms_bind_port_max`): below
/// the kernel's ephemeral ports, so a Kafka client's port never falls in it.
const CEPH_DAEMON_PORTS: &str = "6800:7568";

/// Group ids of the brokers' processes on RADOS: broker `n` runs under `RADOS_GID_BASE + n`.
const RADOS_GID_BASE: u32 = 60_000;

/// The group id broker `id` runs under when the RADOS storage partition is in the mix.
pub fn broker_gid(id: i32) -> u32 {
    RADOS_GID_BASE + id.unsigned_abs()
}

/// Cuts one broker off a RADOS cluster, both ways, with iptables:
///
/// - out: the broker's packets to the monitor's and the OSDs' ports, matched by its group id
///   (`-m owner --gid-owner`, which only the OUTPUT chain has);
/// - in: what the Ceph daemons send back on those connections, matched by a connection mark
///   that a rule installed for the whole run puts on every connection the broker opens to them
///   (the owner of an incoming packet is unknown to iptables).
///
/// Packets are dropped, not refused: TCP retransmits them once the rules go, as after a healed
/// link (the S3 proxy holds its bytes the same way).
pub struct RadosCut {
    /// `13300,13301,6800:7568`: the monitor's ports from the Ceph configuration, then the OSDs'.
    ports: String,
    /// The per-broker marking rules, removed when this is dropped.
    marks: Vec<Vec<String>>,
}

impl RadosCut {
    /// Reads the monitor's ports from the `conf=` file of `url` and installs the marking rule
    /// of each broker in `brokers`.
    pub fn install(url: &str, brokers: i32) -> Result<Self, String> {
        let conf = url
            .split_once('?')
            .and_then(|(_, query)| query.split('&').find_map(|p| p.strip_prefix("conf=")))
            .ok_or("the rados:// URL names no conf= file (needed for the monitor's ports)")?;
        let text = std::fs::read_to_string(conf).map_err(|e| format!("read {conf}: {e}"))?;
        let mon_ports = monitor_ports(&text);
        if mon_ports.is_empty() {
            return Err(format!("no mon_host with ports in {conf}"));
        }
        let mut ports = mon_ports;
        ports.push(CEPH_DAEMON_PORTS.to_string());
        let mut cut = Self {
            ports: ports.join(","),
            marks: Vec::new(),
        };
        for id in 1..=brokers {
            let gid = broker_gid(id).to_string();
            let mut rule = cut.out_match(&gid);
            rule.extend(["-j", "CONNMARK", "--set-mark", &gid].map(String::from));
            iptables_rule("-I", &rule)?;
            cleanup::register(cleanup::Undo::Iptables(rule.clone()));
            cut.marks.push(rule);
        }
        Ok(cut)
    }

    /// `OUTPUT ... owner gid ... Ceph ports`: the broker's own packets to the Ceph daemons.
    fn out_match(&self, gid: &str) -> Vec<String> {
        [
            "OUTPUT",
            "-o",
            "lo",
            "-p",
            "tcp",
            "-m",
            "owner",
            "--gid-owner",
            gid,
            "-m",
            "multiport",
            "--dports",
            &self.ports,
        ]
        .map(String::from)
        .to_vec()
    }

    /// The two DROP rules that cut broker `id` off; insert them, and delete them to heal.
    pub fn drop_rules(&self, id: i32) -> [Vec<String>; 2] {
        let gid = broker_gid(id).to_string();
        let mut out = self.out_match(&gid);
        out.extend(["-j", "DROP"].map(String::from));
        let back = [
            "INPUT", "-i", "lo", "-p", "tcp", "-m", "connmark", "--mark", &gid, "-j", "DROP",
        ]
        .map(String::from)
        .to_vec();
        [out, back]
    }
}

impl Drop for RadosCut {
    fn drop(&mut self) {
        for rule in &self.marks {
            let undo = cleanup::Undo::Iptables(rule.clone());
            undo.run();
            cleanup::unregister(&undo);
        }
    }
}

/// The ports of the `mon_host` (or `mon host`) line: `[v2:127.0.0.1:13300,v1:127.0.0.1:13301]`
/// gives 13300 and 13301.
fn monitor_ports(conf: &str) -> Vec<String> {
    let Some(line) = conf.lines().find(|l| {
        let key = l.trim_start().replace(' ', "_");
        key.starts_with("mon_host")
    }) else {
        return Vec::new();
    };
    let value = line.split_once('=').map_or("", |(_, v)| v);
    value
        .split([',', '[', ']', ' '])
        .filter_map(|addr| addr.rsplit_once(':'))
        .map(|(_, port)| port.trim())
        .filter(|port| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
        .map(str::to_string)
        .collect()
}

/// `iptables -w <action> <rule...>`.
pub fn iptables_rule(action: &str, rule: &[String]) -> Result<(), String> {
    let output = std::process::Command::new("iptables")
        .arg("-w")
        .arg(action)
        .args(rule)
        .output()
        .map_err(|e| format!("cannot run iptables: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "iptables {action} {}: {}",
            rule.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
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
    fn the_monitor_ports_are_read_from_the_ceph_configuration() {
        let conf = "[global]\nfsid = x\nmon_host = [v2:127.0.0.1:13300,v1:127.0.0.1:13301]\n";
        assert_eq!(monitor_ports(conf), ["13300", "13301"]);
        assert_eq!(monitor_ports("mon host = 10.0.0.1:6789\n"), ["6789"]);
        assert!(monitor_ports("[global]\n").is_empty());
    }

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
