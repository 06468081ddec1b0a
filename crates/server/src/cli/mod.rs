//! The operator commands that talk the Kafka protocol to a running broker (`strata topic`,
//! `group`, `acls`, `quotas`, `produce`, `consume`), through [`crate::kafka_client`]. Tables for people by
//! default, `--json` for scripts (one JSON document on stdout).

pub mod acls;
pub mod data;
pub mod group;
pub mod quotas;
pub mod topic;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use strata_core::{Clock, SystemClock};

use crate::kafka_client::Client;

/// How to reach the cluster; every Kafka-protocol command takes these.
#[derive(Debug, clap::Args)]
pub struct Connect {
    /// A broker of the cluster, host:port.
    #[arg(
        long,
        value_name = "HOST:PORT",
        env = "STRATA_BOOTSTRAP_SERVER",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap_server: String,
    /// Give up on a broker that does not answer a request within this long.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub request_timeout: String,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
    /// How to reach the listener, as Kafka's `security.protocol`: PLAINTEXT, SSL,
    /// SASL_PLAINTEXT or SASL_SSL [default: SASL_PLAINTEXT with --sasl-mechanism, else
    /// PLAINTEXT].
    #[arg(long, value_name = "PROTOCOL", env = "STRATA_SECURITY_PROTOCOL")]
    pub security_protocol: Option<String>,
    /// PEM file of the CA certificates that sign the brokers' certificates (SSL and SASL_SSL)
    /// [default: the system's trust store].
    #[arg(long, value_name = "FILE", env = "STRATA_SSL_CA_LOCATION")]
    pub ssl_ca_location: Option<std::path::PathBuf>,
    /// PEM file of this client's certificate, for listeners that require one (mTLS).
    #[arg(long, value_name = "FILE", env = "STRATA_SSL_CERTIFICATE_LOCATION")]
    pub ssl_certificate_location: Option<std::path::PathBuf>,
    /// PEM file of the private key of --ssl-certificate-location.
    #[arg(long, value_name = "FILE", env = "STRATA_SSL_KEY_LOCATION")]
    pub ssl_key_location: Option<std::path::PathBuf>,
    /// Log in with SASL on every connection (SASL_PLAINTEXT and SASL_SSL listeners): PLAIN,
    /// SCRAM-SHA-256 or SCRAM-SHA-512, as Kafka's `sasl.mechanism`.
    #[arg(long, value_name = "MECHANISM", env = "STRATA_SASL_MECHANISM")]
    pub sasl_mechanism: Option<String>,
    /// The SASL user name.
    #[arg(long, value_name = "NAME", env = "STRATA_SASL_USERNAME")]
    pub sasl_username: Option<String>,
    /// The SASL password. Only from the environment, so it stays out of shell history and
    /// process listings.
    #[arg(skip = std::env::var("STRATA_SASL_PASSWORD").ok())]
    pub sasl_password: Option<String>,
}

impl Connect {
    pub async fn client(&self) -> anyhow::Result<(Client, Arc<dyn Clock>)> {
        let clock = SystemClock::shared();
        let timeout = duration("--request-timeout", &self.request_timeout)?;
        let client = Client::connect_as(
            &self.bootstrap_server,
            Arc::clone(&clock),
            timeout,
            self.security()?,
        )
        .await?;
        Ok((client, clock))
    }

    /// TLS and SASL as --security-protocol asks, each checked for what it needs.
    fn security(&self) -> anyhow::Result<strata_client::Security> {
        let protocol = match &self.security_protocol {
            Some(p) => p.trim().to_ascii_uppercase(),
            None if self.sasl_mechanism.is_some() => "SASL_PLAINTEXT".to_string(),
            None => "PLAINTEXT".to_string(),
        };
        let (tls, sasl) = match protocol.as_str() {
            "PLAINTEXT" => (false, false),
            "SSL" => (true, false),
            "SASL_PLAINTEXT" => (false, true),
            "SASL_SSL" => (true, true),
            other => anyhow::bail!(
                "--security-protocol {other:?}: use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
            ),
        };
        if !sasl && (self.sasl_mechanism.is_some() || self.sasl_username.is_some()) {
            anyhow::bail!(
                "--security-protocol {protocol} does not log in: use SASL_PLAINTEXT or \
                 SASL_SSL with --sasl-mechanism"
            );
        }
        let tls_files = self.ssl_ca_location.is_some()
            || self.ssl_certificate_location.is_some()
            || self.ssl_key_location.is_some();
        if !tls && tls_files {
            anyhow::bail!(
                "--ssl-* files need --security-protocol SSL or SASL_SSL (it is {protocol})"
            );
        }
        let tls = if tls {
            let files = strata_client::TlsFiles {
                ca: self.ssl_ca_location.clone(),
                certificate: self.ssl_certificate_location.clone(),
                key: self.ssl_key_location.clone(),
            };
            Some(strata_client::Tls::load(&files)?)
        } else {
            None
        };
        let sasl = if sasl {
            let login = self.sasl()?;
            if login.is_none() {
                anyhow::bail!(
                    "--security-protocol {protocol} needs --sasl-mechanism and --sasl-username \
                     (and the password in STRATA_SASL_PASSWORD)"
                );
            }
            login
        } else {
            None
        };
        Ok(strata_client::Security { tls, sasl })
    }

    fn sasl(&self) -> anyhow::Result<Option<strata_client::SaslCredentials>> {
        let Some(mechanism) = &self.sasl_mechanism else {
            if self.sasl_username.is_some() {
                anyhow::bail!("--sasl-username needs --sasl-mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)");
            }
            return Ok(None);
        };
        let mechanism = strata_client::SaslMechanism::parse(mechanism).with_context(|| {
            format!("--sasl-mechanism {mechanism:?}: use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
        })?;
        let username = self
            .sasl_username
            .clone()
            .context("--sasl-mechanism needs --sasl-username (or STRATA_SASL_USERNAME)")?;
        let password = self
            .sasl_password
            .clone()
            .context("--sasl-mechanism needs the password in STRATA_SASL_PASSWORD")?;
        Ok(Some(strata_client::SaslCredentials {
            mechanism,
            username,
            password,
        }))
    }
}

pub fn duration(flag: &str, text: &str) -> anyhow::Result<Duration> {
    humantime_serde::re::humantime::parse_duration(text)
        .with_context(|| format!("{flag} {text:?} is not a duration (e.g. 30s)"))
}

/// `key=value` as given to --config / --set.
pub fn key_value(text: &str) -> anyhow::Result<(String, String)> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => anyhow::bail!("{text:?} is not key=value (e.g. retention.ms=86400000)"),
    }
}

/// Writes `text` to stdout; a closed pipe (`| head`) is not an error worth reporting.
pub fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = stdout.write_all(b"\n");
    }
    let _ = stdout.flush();
}

pub fn out_json(value: &serde_json::Value) {
    out(&serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".into()));
}

/// Columns padded to their widest cell, the last one unpadded.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut text = String::new();
    let mut line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            text.push_str(cell);
            if i < last {
                let pad = widths[i].saturating_sub(cell.chars().count()) + 2;
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        text.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pad_every_column_but_the_last() {
        let text = table(
            &["TOPIC", "PARTITIONS"],
            &[
                vec!["orders".into(), "3".into()],
                vec!["a".into(), "12".into()],
            ],
        );
        assert_eq!(text, "TOPIC   PARTITIONS\norders  3\na       12\n");
    }

    #[test]
    fn key_values_need_a_key() {
        assert_eq!(
            key_value("retention.ms=1=2").unwrap(),
            ("retention.ms".into(), "1=2".into())
        );
        assert!(key_value("=1").is_err());
        assert!(key_value("x").is_err());
    }
}
