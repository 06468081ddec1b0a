//! SASL/OAUTHBEARER (RFC 7628, KIP-255, KIP-768): the client's first message carries a JWT,
//! checked against the public keys of a JWKS file, the issuer, the audience and the expiry.
//!
//! Signatures are `jsonwebtoken`'s (ring); only asymmetric algorithms are accepted (RS*,
//! PS*, ES256, ES384), so a key published to verify tokens can never be used to forge one.
//! Times are checked here against the broker's clock, not by the crate against the system's.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use strata_core::Clock;

use super::SecurityError;

/// Longest first message accepted: a JWT with generous claims fits many times over.
pub const MAX_MESSAGE_LEN: usize = 64 * 1024;

/// Why the JWKS file could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("OAUTHBEARER keys from {path}: {reason}")]
pub struct JwksError {
    path: String,
    reason: String,
}

/// What a token must satisfy.
#[derive(Debug, Clone)]
pub struct OAuthSettings {
    /// `iss` must equal this, if set (Kafka's `sasl.oauthbearer.expected.issuer`).
    pub expected_issuer: Option<String>,
    /// `aud` must name one of these, if any (`sasl.oauthbearer.expected.audience`).
    pub expected_audience: Vec<String>,
    /// Slack allowed on `exp`, `nbf` and `iat` (`sasl.oauthbearer.clock.skew.seconds`).
    pub clock_skew: Duration,
    /// The claim naming the principal (`sasl.oauthbearer.sub.claim.name`).
    pub sub_claim_name: String,
}

struct Key {
    kid: Option<String>,
    algorithms: Vec<Algorithm>,
    key: DecodingKey,
}

/// Checks OAUTHBEARER tokens.
pub struct TokenValidator {
    keys: Vec<Key>,
    settings: OAuthSettings,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for TokenValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenValidator")
            .field("keys", &self.keys.len())
            .field("settings", &self.settings)
            .finish()
    }
}

/// A validated token: who it is for and until when (milliseconds since the epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidToken {
    pub principal: String,
    pub expires_at_ms: i64,
}

const RSA_ALGORITHMS: [Algorithm; 6] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

impl TokenValidator {
    /// Loads the public keys of the JWKS file at `path` (`{"keys": [...]}`, RSA and EC keys;
    /// others are skipped).
    pub fn from_jwks_file(
        path: &Path,
        settings: OAuthSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, JwksError> {
        let error = |reason: String| JwksError {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
        Self::from_jwks(&text, settings, clock).map_err(error)
    }

    pub fn from_jwks(
        text: &str,
        settings: OAuthSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, String> {
        let set: JwkSet = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut keys = Vec::new();
        for jwk in &set.keys {
            let algorithms = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => RSA_ALGORITHMS.to_vec(),
                AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                    jsonwebtoken::jwk::EllipticCurve::P256 => vec![Algorithm::ES256],
                    jsonwebtoken::jwk::EllipticCurve::P384 => vec![Algorithm::ES384],
                    _ => continue,
                },
                // Symmetric and other keys: a shared secret in a key file would let whoever
                // reads it mint tokens.
                _ => continue,
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("a key: {e}"))?;
            keys.push(Key {
                kid: jwk.common.key_id.clone(),
                algorithms,
                key,
            });
        }
        if keys.is_empty() {
            return Err("no RSA or EC (P-256, P-384) public key".into());
        }
        Ok(Self {
            keys,
            settings,
            clock,
        })
    }

    /// Checks `token`: signature by a known key, issuer, audience, times, and the principal
    /// claim. Every failure is `BadCredentials` with the reason for the log.
    pub fn validate(&self, token: &str) -> Result<ValidToken, TokenError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| TokenError(format!("unreadable token header: {e}")))?;
        let candidates: Vec<&Key> = self
            .keys
            .iter()
            .filter(|k| k.algorithms.contains(&header.alg))
            .filter(|k| match (&header.kid, &k.kid) {
                (Some(wanted), Some(kid)) => wanted == kid,
                _ => true,
            })
            .collect();
        if candidates.is_empty() {
            return Err(TokenError(format!(
                "no key for algorithm {:?} and key id {:?}",
                header.alg, header.kid
            )));
        }
        let mut validation = Validation::new(header.alg);
        // Times are checked below on the broker's clock; audience and issuer here too, so
        // that their absence is told apart from a mismatch.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let mut last_error = None;
        let mut claims = None;
        for key in candidates {
            match jsonwebtoken::decode::<Value>(token, &key.key, &validation) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(e) => last_error = Some(e),
            }
        }
        let claims = claims.ok_or_else(|| {
            TokenError(format!(
                "signature not verified: {}",
                last_error.map_or_else(String::new, |e| e.to_string())
            ))
        })?;
        self.check_claims(&claims)
    }

    fn check_claims(&self, claims: &Value) -> Result<ValidToken, TokenError> {
        let now_ms = self.clock.wall_millis();
        let skew_ms = i64::try_from(self.settings.clock_skew.as_millis()).unwrap_or(i64::MAX);
        let seconds = |name: &str| -> Result<Option<i64>, TokenError> {
            match claims.get(name) {
                None => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(|s| Some((s * 1000.0) as i64))
                    .ok_or_else(|| TokenError(format!("claim {name} is not a number"))),
            }
        };
        let exp = seconds("exp")?.ok_or_else(|| TokenError("no exp claim".into()))?;
        if now_ms > exp.saturating_add(skew_ms) {
            return Err(TokenError(format!(
                "expired {} ms ago",
                now_ms.saturating_sub(exp)
            )));
        }
        if let Some(nbf) = seconds("nbf")? {
            if now_ms.saturating_add(skew_ms) < nbf {
                return Err(TokenError("not valid yet (nbf)".into()));
            }
        }
        if let Some(iat) = seconds("iat")? {
            if now_ms.saturating_add(skew_ms) < iat {
                return Err(TokenError("issued in the future (iat)".into()));
            }
        }
        if let Some(issuer) = &self.settings.expected_issuer {
            if claims.get("iss").and_then(Value::as_str) != Some(issuer.as_str()) {
                return Err(TokenError(format!(
                    "issuer {:?} is not {issuer:?}",
                    claims.get("iss")
                )));
            }
        }
        if !self.settings.expected_audience.is_empty() {
            let audiences: Vec<&str> = match claims.get("aud") {
                Some(Value::String(one)) => vec![one.as_str()],
                Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if !audiences
                .iter()
                .any(|a| self.settings.expected_audience.iter().any(|e| e == a))
            {
                return Err(TokenError(format!(
                    "audience {audiences:?} is none of {:?}",
                    self.settings.expected_audience
                )));
            }
        }
        let claim = &self.settings.sub_claim_name;
        let principal = claims
            .get(claim.as_str())
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| TokenError(format!("no {claim} claim naming the principal")))?;
        Ok(ValidToken {
            principal: principal.to_string(),
            expires_at_ms: exp,
        })
    }
}

/// Why a token was refused (for the log; the client is told only `invalid_token`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TokenError(pub String);

/// The token and authorization id of an RFC 7628 client first message:
/// `n,[a=authzid],` `\x01` `key=value\x01`… `\x01`, with `auth=Bearer <token>` among the pairs.
pub fn parse_client_first(message: &[u8]) -> Result<(Option<String>, String), SecurityError> {
    let bad = |why: &str| SecurityError::BadSaslMessage(why.to_string());
    if message.len() > MAX_MESSAGE_LEN {
        return Err(bad("message too long"));
    }
    let text = std::str::from_utf8(message).map_err(|_| bad("not UTF-8"))?;
    let rest = text
        .strip_prefix("n,")
        .ok_or_else(|| bad("no `n,` GS2 header (channel binding is not supported)"))?;
    let (authzid, rest) = rest
        .split_once(',')
        .ok_or_else(|| bad("unterminated GS2 header"))?;
    let authzid = match authzid {
        "" => None,
        a => Some(
            a.strip_prefix("a=")
                .filter(|a| !a.is_empty())
                .ok_or_else(|| bad("bad authorization id"))?
                .to_string(),
        ),
    };
    let pairs = rest
        .strip_prefix('\x01')
        .and_then(|r| r.strip_suffix("\x01\x01"))
        .ok_or_else(|| bad("key-value pairs not framed by \\x01"))?;
    let mut token = None;
    for pair in pairs.split('\x01') {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| bad("a key-value pair without `=`"))?;
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(bad("a bad key"));
        }
        if key == "auth" {
            if token.is_some() {
                return Err(bad("auth given twice"));
            }
            let (scheme, value) = value
                .split_once(' ')
                .ok_or_else(|| bad("auth is not `Bearer <token>`"))?;
            if !scheme.eq_ignore_ascii_case("bearer") {
                return Err(bad("auth is not `Bearer <token>`"));
            }
            let value = value.trim();
            if value.is_empty() {
                return Err(bad("empty token"));
            }
            token = Some(value.to_string());
        }
    }
    let token = token.ok_or_else(|| bad("no auth=Bearer <token>"))?;
    Ok((authzid, token))
}

/// What the server sends after refusing a token (RFC 7628 §3.2.2), before failing the
/// exchange once the client acknowledges with `\x01`.
pub const ERROR_CHALLENGE: &[u8] = br#"{"status":"invalid_token"}"#;

#[cfg(test)]
mod tests;
