//! `strata users create|delete|list`: SCRAM users written straight to the cluster's storage,
//! so the first administrator exists before any broker runs. Brokers see a change within
//! their `sasl_user_cache_ttl`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use strata_broker::security::random_salt;
use strata_broker::security::scram::{Credential, Mechanism, MIN_ITERATIONS};
use strata_broker::security::users::{Change, UserStore};
use strata_core::SystemClock;

use crate::admin::ClusterStorage;

#[derive(Debug, clap::Subcommand)]
pub enum UsersCommand {
    /// Create a SCRAM user, or replace the credential of one mechanism of an existing user.
    /// The password itself is not stored: only its salted SCRAM keys (RFC 5802).
    Create(CreateArgs),
    /// Delete one mechanism's credential of a user (the user can no longer log in with it).
    Delete(DeleteArgs),
    /// List users and their mechanisms (never salts or keys).
    List(ListArgs),
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    storage: ClusterStorage,
    #[arg(long, value_name = "NAME")]
    user: String,
    /// The password (visible in the process list; prefer --password-file).
    #[arg(long, value_name = "PASSWORD", conflicts_with = "password_file")]
    password: Option<String>,
    /// A file whose first line is the password.
    #[arg(long, value_name = "PATH")]
    password_file: Option<PathBuf>,
    /// SCRAM-SHA-256 or SCRAM-SHA-512. PLAIN logins are checked against either.
    #[arg(long, value_name = "MECHANISM", default_value = "SCRAM-SHA-512")]
    mechanism: String,
    /// PBKDF2 iterations (4096 to 16384).
    #[arg(long, value_name = "N", default_value_t = MIN_ITERATIONS)]
    iterations: u32,
}

#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    storage: ClusterStorage,
    #[arg(long, value_name = "NAME")]
    user: String,
    #[arg(long, value_name = "MECHANISM", default_value = "SCRAM-SHA-512")]
    mechanism: String,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    storage: ClusterStorage,
}

async fn open(storage: &str) -> anyhow::Result<UserStore> {
    let store = crate::open_backend(storage.to_string())
        .await
        .with_context(|| format!("opening storage {storage:?}"))?;
    // No cache: every call here reads storage.
    Ok(UserStore::new(
        store,
        SystemClock::shared(),
        Duration::ZERO,
        1,
    ))
}

fn mechanism(name: &str) -> anyhow::Result<Mechanism> {
    Mechanism::from_name(&name.to_ascii_uppercase())
        .with_context(|| format!("--mechanism {name:?} is not SCRAM-SHA-256 or SCRAM-SHA-512"))
}

pub async fn run(command: UsersCommand) -> anyhow::Result<()> {
    match command {
        UsersCommand::Create(args) => {
            let mechanism = mechanism(&args.mechanism)?;
            let password = match (&args.password, &args.password_file) {
                (Some(password), None) => password.clone(),
                (None, Some(path)) => std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
                _ => bail!("give --password or --password-file"),
            };
            if password.is_empty() {
                bail!("the password is empty");
            }
            let salt = random_salt()?;
            let credential =
                Credential::from_password(mechanism, password.as_bytes(), salt, args.iterations);
            open(args.storage.cluster_url())
                .await?
                .alter(&args.user, &[Change::Upsert(credential)])
                .await?;
            let _ = writeln!(
                std::io::stderr(),
                "user {} has a {} credential",
                args.user,
                mechanism.name()
            );
        }
        UsersCommand::Delete(args) => {
            let mechanism = mechanism(&args.mechanism)?;
            open(args.storage.cluster_url())
                .await?
                .alter(&args.user, &[Change::Delete(mechanism)])
                .await?;
        }
        UsersCommand::List(args) => {
            let users = open(args.storage.cluster_url()).await?.list().await?;
            let mut out = std::io::stdout().lock();
            for (name, user) in users {
                let mechanisms: Vec<String> = user
                    .credentials
                    .iter()
                    .map(|c| format!("{} (iterations {})", c.mechanism, c.iterations))
                    .collect();
                writeln!(out, "{name}\t{}", mechanisms.join(", "))?;
            }
        }
    }
    Ok(())
}
