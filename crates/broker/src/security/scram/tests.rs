use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// RFC 7677 §3's example exchange (user "user", password "pencil").
const FIRST: &[u8] = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
const SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
const SALT_B64: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
const SERVER_FIRST: &str =
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const FINAL: &[u8] = b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const SERVER_FINAL: &[u8] = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

fn rfc_credential() -> Credential {
    let salt = B64.decode(SALT_B64).unwrap();
    Credential::from_password(Mechanism::Sha256, b"pencil", salt, 4096)
}

fn rfc_exchange(credential: Option<Credential>) -> ServerExchange {
    let first = parse_client_first(FIRST).unwrap();
    let fake = Credential::fake(Mechanism::Sha256, &first.user, b"secret");
    ServerExchange::start(first, credential, fake, SERVER_NONCE)
}

#[test]
fn the_rfc_7677_exchange_verifies_and_signs() {
    let exchange = rfc_exchange(Some(rfc_credential()));
    assert_eq!(exchange.user(), "user");
    assert_eq!(exchange.server_first(), SERVER_FIRST.as_bytes());
    assert_eq!(exchange.finish(FINAL).unwrap(), SERVER_FINAL);
}

#[test]
fn a_wrong_password_and_an_unknown_user_fail_alike() {
    let salt = B64.decode(SALT_B64).unwrap();
    let wrong = Credential::from_password(Mechanism::Sha256, b"pencil2", salt, 4096);
    assert!(matches!(
        rfc_exchange(Some(wrong)).finish(FINAL),
        Err(SecurityError::BadCredentials)
    ));
    assert!(matches!(
        rfc_exchange(None).finish(FINAL),
        Err(SecurityError::BadCredentials)
    ));
}

#[test]
fn an_unknown_user_gets_the_same_salt_every_time_and_a_plausible_one() {
    let a = Credential::fake(Mechanism::Sha512, "nobody", b"k");
    let b = Credential::fake(Mechanism::Sha512, "nobody", b"k");
    let c = Credential::fake(Mechanism::Sha512, "somebody", b"k");
    assert_eq!(a.salt, b.salt);
    assert_ne!(a.salt, c.salt);
    assert_eq!(a.salt.len(), SALT_LEN);
    assert_eq!(a.iterations, MIN_ITERATIONS);
}

#[test]
fn plain_passwords_verify_against_the_stored_credential() {
    let credential = rfc_credential();
    assert!(credential.verify_password(b"pencil"));
    assert!(!credential.verify_password(b"pencil "));
    assert!(!credential.verify_password(b""));
}

#[test]
fn names_are_unescaped_and_extensions_read() {
    let first = parse_client_first(b"n,,n=a=2Cb=3Dc,r=abc,tokenauth=true").unwrap();
    assert_eq!(first.user, "a,b=c");
    assert!(first.token_auth);
    assert_eq!(first.bare, "n=a=2Cb=3Dc,r=abc,tokenauth=true");
    let first = parse_client_first(b"y,a=bob,n=bob,r=x").unwrap();
    assert_eq!(first.gs2_header, "y,a=bob,");
}

#[test]
fn malformed_client_first_messages_are_errors() {
    let cases: &[&[u8]] = &[
        b"",
        b"n",
        b"n,",
        b"n,,",
        b"x,,n=user,r=abc",
        b"p=tls-unique,,n=user,r=abc",
        b"n,b=x,n=user,r=abc",
        b"n,a=other,n=user,r=abc",
        b"n,,m=ext,n=user,r=abc",
        b"n,,user,r=abc",
        b"n,,n=,r=abc",
        b"n,,n=us=er,r=abc",
        b"n,,n=user=2",
        b"n,,n=user",
        b"n,,n=user,r=",
        b"n,,n=user,x=abc",
        b"n,,n=user,r=a b",
        b"n,,n=user,r=abc,noequals",
        b"n,,n=user,r=abc,=v",
        b"n,,n=\xff\xfe,r=abc",
    ];
    for case in cases {
        assert!(
            parse_client_first(case).is_err(),
            "{:?}",
            String::from_utf8_lossy(case)
        );
    }
    let long = [b"n,,n=user,r=".as_slice(), &[b'a'; MAX_MESSAGE_LEN]].concat();
    assert!(parse_client_first(&long).is_err());
}

#[test]
fn malformed_client_final_messages_are_errors() {
    let cases: &[&[u8]] = &[
        b"",
        b"c=biws",
        b"c=biws,r=abc",
        b"c=biws,r=abc,p=",
        b"c=biws,r=abc,p=!!!",
        b"c=***,r=abc,p=AAAA",
        b"r=abc,c=biws,p=AAAA",
        b"c=biws,p=AAAA",
        b"c=biws,r=,p=AAAA",
        b"c=biws,r=abc,junk,p=AAAA",
        b"c=biws,r=a\xffc,p=AAAA",
    ];
    for case in cases {
        let parsed = parse_client_final(case);
        // `p=` of nothing is a proof of zero bytes: well-formed, and refused by `finish`.
        if *case == b"c=biws,r=abc,p=" {
            assert!(parsed.is_ok_and(|f| f.proof.is_empty()));
            continue;
        }
        assert!(parsed.is_err(), "{:?}", String::from_utf8_lossy(case));
    }
}

#[test]
fn a_final_message_with_the_wrong_binding_or_nonce_or_a_short_proof_fails() {
    let exchange = rfc_exchange(Some(rfc_credential()));
    let text = std::str::from_utf8(FINAL).unwrap();
    for bad in [
        text.replace("c=biws", "c=eSws"),
        text.replace("r=rOprNGfwEbeRWgbNEkqO%", "r=rOprNGfwEbeRWgbNEkqX%"),
        text.replace("p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", "p=dHzb"),
    ] {
        assert!(exchange.finish(bad.as_bytes()).is_err(), "{bad}");
    }
}

/// Property: whatever bytes a client sends — random, or a valid message with bytes flipped,
/// cut or inserted — the parsers return (never panic), and no altered final message
/// authenticates.
#[test]
fn random_and_mutated_messages_never_panic_and_never_authenticate() {
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let exchange = rfc_exchange(Some(rfc_credential()));
    let alphabet = b"nyrcpsima=,23CD+/ \x00\xff";
    for _ in 0..20_000 {
        let random: Vec<u8> = (0..rng.random_range(0..64))
            .map(|_| {
                if rng.random_bool(0.7) {
                    alphabet[rng.random_range(0..alphabet.len())]
                } else {
                    rng.random()
                }
            })
            .collect();
        let _ = parse_client_first(&random);
        let _ = parse_client_final(&random);
        assert!(exchange.finish(&random).is_err());

        for valid in [FIRST, FINAL] {
            let mut mutated = valid.to_vec();
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..mutated.len().max(1));
                match rng.random_range(0..3) {
                    0 if !mutated.is_empty() => mutated[at] ^= 1 << rng.random_range(0..8),
                    1 => mutated.truncate(at),
                    _ => mutated.insert(at.min(mutated.len()), rng.random()),
                }
            }
            let _ = parse_client_first(&mutated);
            if valid == FINAL && mutated != FINAL {
                // A base64 proof can change in its last character's unused bits and still
                // decode to the same bytes; only a message meaning the same may pass.
                if let Ok(result) = exchange.finish(&mutated) {
                    let parsed = parse_client_final(&mutated).unwrap();
                    let original = parse_client_final(FINAL).unwrap();
                    assert_eq!(parsed, original, "{result:?}");
                }
            }
        }
    }
}
