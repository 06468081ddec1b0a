//! Test certificates, made at test time with the `openssl` command (`.ci/run` installs it):
//! a CA, a server certificate for `localhost` and 127.0.0.1, and client certificates on
//! demand.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::command::{is_installed, run_with_deadline};

/// How long one openssl run may take.
const OPENSSL_DEADLINE: Duration = Duration::from_secs(90);

/// A CA and a server certificate for 127.0.0.1 and localhost signed by it, made with openssl.
pub struct Certificates {
    dir: tempfile::TempDir,
}

impl Certificates {
    pub fn make() -> Self {
        assert!(
            is_installed("openssl"),
            "openssl is not installed (Debian package openssl; .ci/run installs it)"
        );
        let dir = tempfile::Builder::new()
            .prefix("strata-certs-")
            .tempdir()
            .unwrap();
        let run = |args: &[&str]| {
            let mut command = Command::new("openssl");
            command.args(args).current_dir(dir.path());
            run_with_deadline(command, b"", OPENSSL_DEADLINE).assert_success(&args.join(" "));
        };
        std::fs::write(
            dir.path().join("san.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        run(&[
            &["req", "-x509"],
            &ec[..],
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=strata-test-ca",
            ],
        ]
        .concat());
        run(&[
            &["req"],
            &ec[..],
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
        ]
        .concat());
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
        Self { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn openssl(&self, args: &[&str]) {
        let mut command = Command::new("openssl");
        command.args(args).current_dir(self.dir.path());
        run_with_deadline(command, b"", OPENSSL_DEADLINE).assert_success(&args.join(" "));
    }

    /// A new self-signed CA, `NAME.pem` and `NAME.key`.
    pub fn ca(&self, name: &str) {
        let (key, pem, subject) = (
            format!("{name}.key"),
            format!("{name}.pem"),
            format!("/CN={name}"),
        );
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            &subject,
        ]);
    }

    /// `NAME.pem` with `subject` (openssl's `/O=../CN=..` form), signed by CA `ca`, with the
    /// key `key` (made if it does not exist) and the extensions in `extfile` (default: a
    /// client certificate's).
    pub fn signed(&self, name: &str, subject: &str, ca: &str, key: &str, extfile: Option<&str>) {
        let csr = format!("{name}.csr");
        let mut request = vec!["req", "-new", "-subj", subject, "-out", &csr];
        let key_path = self.path(key);
        if key_path.exists() {
            request.extend(["-key", key]);
        } else {
            request.extend([
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                key,
            ]);
        }
        self.openssl(&request);
        let (ca_pem, ca_key, pem) = (
            format!("{ca}.pem"),
            format!("{ca}.key"),
            format!("{name}.pem"),
        );
        let mut sign = vec![
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
        ];
        // Extensions make it an X.509 v3 certificate: WebPKI refuses v1 ones.
        std::fs::write(self.path("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        sign.extend(["-extfile", extfile.unwrap_or("client.ext")]);
        self.openssl(&sign);
    }
}
