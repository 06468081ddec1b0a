//! Tokens signed with throwaway keys made for these tests (and nothing else) with Python's
//! `cryptography`; the JWKS holds their public halves and a symmetric key that must be ignored.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;
use strata_core::clock::ManualClock;

use super::*;

const RSA_DER: &str = "MIIEpQIBAAKCAQEA6/Zpi9HuxRXpijsXxJKCn8oAaLeEZBGFuLD/lqGT4oxrJY1SFkxTXqR5o3Ntk5b4E2CJ4wPC+UEvRD6FpB3qgVS78qL83E3b0xNS0juOCl6+GQLrJ6CWEdC2P6gIs2IHX3S6E/kSWYH7l/g/zwSl27zwTfrMpffwEzGGMkfAeK5aFbS6KdrXHervboehM2l/CQmGjBMHprXCtf76au6hqwE7950h1bxZ7bBAZ1y/vYBpmYY1uEXO/3hdtyDKsNtEf8KjJwSq0E1KqDUTArbA0Q+DKiyVPCSJbl4z9DGvuX/mdVSaC/pta/u72CfJRN5AiWv5xuF7N6Iwn+HkPRnJ8wIDAQABAoIBAHORMkx6u3jnrIQ5QQDTyQo9w0mGaF8ifd3hQq0h4e5ZW7j+qC+nnkWCRNkbFZXtoP7Mj3wSQZIWrPG9tXKV/F7vg0XpMfMsZvfQRQYWiRDnKi/R0B6OdjGviTNQN0K0RmwoHWLe4G/aS8E4ovffjOQ8e22V4ll/P6QG43UI02nG+jLc1l/mAf/rtSzJzED6l+vqzIp1cLEfRRUUgRO0o9NOqJ5CfpX9UonjvPphv5W3qpGvDvzEOkWBEztfVcPGmnoH+uLZVszDX2wJPBf/wV/meRE1xGmmeGp9dgXPuwnXcELQurCTl5NcaT3gKch1L4EgChpscBthQZuLrMQqOVECgYEA9wSGwdLSoHZBlc8yr1IkZjHOpeDH/9va6tuIupXyqA4fUo3qEMkWOGESPUy9/o80BAJLhwvxUVzVl5/0Y9wNd/9SY0R9cJhX+rt9CyzADJ2a0pg+5NUdE8nW/z67JE5Psc3VrcwSEu7beR+1u7b/O38yuMHiTYoXKjJeuN3UKy0CgYEA9Ir5asiZ6X/yC/PJD5c73r4Z5ya1EINgyImXxwQrh3eBS9cRULDNjt5pmw295DrTeAkTV2fj0cuzBasRZzy07dGP+BUHHE8ynGpH9PCWXSydLpYuRz29ksMHGR6A27RJ4t7m9c9WjwpLNlcRiQbuw4atm5o3Kajf3ISJHeD2fZ8CgYEAq/Odrw0IDCVl8Fgky0CeD/m6BWSdNLGiCf06h9Bb87qo+TnK51ZjvmlsXfmvBKZBKk1CsEaS/PVnxj3VzTHgulikzG9f9uJF1EdxezbylZWcsd7DYV4s+Jp3rITJlzNgbMCBb5NwPXfCleWKB5sSvyMDdvOYiiuHhps7rurUiB0CgYEAorLv/NbYaB1DGiapZ+ET6T+LlloPb5wpQWMiAzxIBcpB0QaXM5teOCbMFmhPJdDpr1xCbQ3m6kdfpW7KlmgybGPYKJM89t3Oa3jexR1ovTcYoM00nxt5zHJLf6/mxcYuvm3VNkgra+HKZq4JMaTWKGqriPJSrzn3Lw1S+PkapjsCgYEA4HMNn+aq4q5/+f8vcQK0B3UHDS9+yy1dW82jF+ayK+rrJPeplOZGset1h5pPkEv8qlJ2e4R5voYgqBJEP4SPrVziGMaWOvOmJm6KLzzyKDp0ft9SuY1C+3zZVV0AXEVRRcXqXr6fcfAtqOYale7A1QwyGIVGVETIYMUcznrZFXo=";
const EC_DER: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg52b+XfmbScLUVlWOAoaiKfgz8PCe2dMuVZxRqx6rJ62hRANCAAQyT99gFJTjB44nj/andTOKM4ZWIT0dWQiQcvCsEZkXIPpF4HeaqYlpAFcq/tBlnstME2MN217QQJN1mpvSKPN1";
const JWKS: &str = r#"{"keys": [{"kty": "RSA", "kid": "rsa-1", "use": "sig", "alg": "RS256", "n": "6_Zpi9HuxRXpijsXxJKCn8oAaLeEZBGFuLD_lqGT4oxrJY1SFkxTXqR5o3Ntk5b4E2CJ4wPC-UEvRD6FpB3qgVS78qL83E3b0xNS0juOCl6-GQLrJ6CWEdC2P6gIs2IHX3S6E_kSWYH7l_g_zwSl27zwTfrMpffwEzGGMkfAeK5aFbS6KdrXHervboehM2l_CQmGjBMHprXCtf76au6hqwE7950h1bxZ7bBAZ1y_vYBpmYY1uEXO_3hdtyDKsNtEf8KjJwSq0E1KqDUTArbA0Q-DKiyVPCSJbl4z9DGvuX_mdVSaC_pta_u72CfJRN5AiWv5xuF7N6Iwn-HkPRnJ8w", "e": "AQAB"}, {"kty": "EC", "kid": "ec-1", "use": "sig", "alg": "ES256", "crv": "P-256", "x": "Mk_fYBSU4weOJ4_2p3UzijOGViE9HVkIkHLwrBGZFyA", "y": "-kXgd5qpiWkAVyr-0GWey0wTYw3bXtBAk3Wam9Io83U"}, {"kty": "oct", "kid": "secret", "k": "MDEyMzQ1Njc4OWFiY2RlZg"}]}"#;

const NOW_S: i64 = 1_800_000_000;

fn validator(audience: &[&str]) -> TokenValidator {
    let clock = Arc::new(ManualClock::new(NOW_S * 1000));
    TokenValidator::from_jwks(
        JWKS,
        OAuthSettings {
            expected_issuer: Some("https://issuer.test".into()),
            expected_audience: audience.iter().map(|a| a.to_string()).collect(),
            clock_skew: Duration::from_secs(30),
            sub_claim_name: "sub".into(),
        },
        clock,
    )
    .unwrap()
}

fn der(b64: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}

fn sign(alg: Algorithm, kid: Option<&str>, claims: serde_json::Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(String::from);
    let key = match alg {
        Algorithm::ES256 => EncodingKey::from_ec_der(&der(EC_DER)),
        Algorithm::HS256 => EncodingKey::from_secret(b"0123456789abcdef"),
        _ => EncodingKey::from_rsa_der(&der(RSA_DER)),
    };
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

fn claims(sub: &str, exp_offset_s: i64, aud: &str) -> serde_json::Value {
    json!({"sub": sub, "iss": "https://issuer.test", "aud": aud, "exp": NOW_S + exp_offset_s, "iat": NOW_S - 10})
}

#[test]
fn rs256_and_es256_tokens_name_their_subject() {
    let v = validator(&["strata"]);
    for (alg, kid) in [
        (Algorithm::RS256, Some("rsa-1")),
        (Algorithm::ES256, Some("ec-1")),
        (Algorithm::RS256, None),
    ] {
        let token = sign(alg, kid, claims("alice", 60, "strata"));
        assert_eq!(
            v.validate(&token).unwrap(),
            ValidToken {
                principal: "alice".into(),
                expires_at_ms: (NOW_S + 60) * 1000
            },
            "{alg:?}"
        );
    }
    // An audience list naming ours, and no audience expected at all.
    let token = sign(
        Algorithm::RS256,
        None,
        json!({"sub": "bob", "iss": "https://issuer.test", "aud": ["x", "strata"], "exp": NOW_S + 5}),
    );
    assert_eq!(v.validate(&token).unwrap().principal, "bob");
    let token = sign(Algorithm::ES256, None, claims("carol", 60, "elsewhere"));
    assert_eq!(validator(&[]).validate(&token).unwrap().principal, "carol");
}

#[test]
fn expiry_allows_the_clock_skew_and_no_more() {
    let v = validator(&["strata"]);
    assert!(v
        .validate(&sign(Algorithm::RS256, None, claims("a", -29, "strata")))
        .is_ok());
    let e = v
        .validate(&sign(Algorithm::RS256, None, claims("a", -31, "strata")))
        .unwrap_err();
    assert!(e.0.contains("expired"), "{e}");
    let no_exp = json!({"sub": "a", "iss": "https://issuer.test", "aud": "strata"});
    assert!(v.validate(&sign(Algorithm::RS256, None, no_exp)).is_err());
    let future = json!({"sub": "a", "iss": "https://issuer.test", "aud": "strata", "exp": NOW_S + 600, "nbf": NOW_S + 60});
    assert!(v.validate(&sign(Algorithm::RS256, None, future)).is_err());
}

#[test]
fn wrong_audience_issuer_key_or_algorithm_is_refused() {
    let v = validator(&["strata"]);
    let refused = |token: String| v.validate(&token).unwrap_err().0;
    assert!(refused(sign(Algorithm::RS256, None, claims("a", 60, "other"))).contains("audience"));
    let mut wrong_issuer = claims("a", 60, "strata");
    wrong_issuer["iss"] = json!("https://evil.test");
    assert!(refused(sign(Algorithm::RS256, None, wrong_issuer)).contains("issuer"));
    // The kid names the EC key but the token is RSA-signed: no key for it.
    assert!(refused(sign(
        Algorithm::RS256,
        Some("ec-1"),
        claims("a", 60, "strata")
    ))
    .contains("no key"));
    // HS256 with the symmetric key published in the JWKS: never accepted.
    assert!(refused(sign(
        Algorithm::HS256,
        Some("secret"),
        claims("a", 60, "strata")
    ))
    .contains("no key"));
    // A tampered payload.
    let token = sign(Algorithm::ES256, None, claims("alice", 60, "strata"));
    let mut parts: Vec<String> = token.split('.').map(String::from).collect();
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    parts[1] = engine.encode(serde_json::to_vec(&claims("admin", 60, "strata")).unwrap());
    assert!(refused(parts.join(".")).contains("signature"));
    assert!(refused("garbage".into()).contains("header"));
    let no_sub = json!({"iss": "https://issuer.test", "aud": "strata", "exp": NOW_S + 60});
    assert!(refused(sign(Algorithm::RS256, None, no_sub)).contains("sub"));
}

#[test]
fn client_first_messages_parse_per_rfc_7628() {
    assert_eq!(
        parse_client_first(b"n,,\x01auth=Bearer abc.def.ghi\x01\x01").unwrap(),
        (None, "abc.def.ghi".to_string())
    );
    assert_eq!(
        parse_client_first(b"n,a=alice,\x01host=h\x01auth=bearer t\x01ext=1\x01\x01").unwrap(),
        (Some("alice".to_string()), "t".to_string())
    );
    for bad in [
        &b""[..],
        b"y,,\x01auth=Bearer t\x01\x01",
        b"p=x,,\x01auth=Bearer t\x01\x01",
        b"n,,\x01auth=Bearer t\x01",
        b"n,,\x01auth=Basic t\x01\x01",
        b"n,,\x01auth=Bearer \x01\x01",
        b"n,,\x01host=h\x01\x01",
        b"n,,\x01auth=Bearer a\x01auth=Bearer b\x01\x01",
        b"n,b=x,\x01auth=Bearer t\x01\x01",
        b"n,,\x01=x\x01auth=Bearer t\x01\x01",
        b"\xff\xfe",
    ] {
        assert!(parse_client_first(bad).is_err(), "{bad:?}");
    }
    assert!(parse_client_first(&vec![b'a'; MAX_MESSAGE_LEN + 1]).is_err());
}
