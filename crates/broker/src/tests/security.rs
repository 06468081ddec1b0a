//! SASL over the wire, in process: a broker whose one listener is SASL_PLAINTEXT, users
//! created through AlterUserScramCredentials (on a PLAINTEXT broker over the same store) and
//! logged in with PLAIN in the unframed v0 form and with SCRAM-SHA-256 framed, the client's side
//! of SCRAM computed here from the RFC.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
use sha2::{Digest, Sha256};

use super::*;
use crate::security::{Listener, SecurityProtocol};

async fn sasl_broker(store: Arc<dyn ObjectStore>) -> (SocketAddr, oneshot::Sender<()>) {
    let clock = SystemClock::shared();
    let log = LogManager::open(
        Arc::clone(&store),
        Arc::clone(&clock),
        LogConfig::default(),
        BrokerId(0),
    )
    .await
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let broker = Broker::open(BrokerParts {
        log,
        clock,
        settings: BrokerSettings {
            advertised_port: addr.port(),
            ..BrokerSettings::default()
        },
        member_id_seed: rand_seed(),
    })
    .await
    .unwrap()
    .with_users(store);
    let info = Listener {
        name: "SASL_PLAINTEXT".into(),
        protocol: SecurityProtocol::SaslPlaintext,
        advertised_host: "127.0.0.1".into(),
        advertised_port: addr.port(),
        tls: None,
    };
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        Arc::new(broker).serve_listeners(vec![(listener, info)], async {
            let _ = stopped.await;
        }),
    );
    (addr, stop)
}

fn hmac256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn salted(password: &str, salt: &[u8], iterations: u32) -> Vec<u8> {
    let mut out = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<Sha256>(password.as_bytes(), salt, iterations, &mut out);
    out.to_vec()
}

async fn create_user(client: &mut Client, user: &str, password: &str) {
    let mut upsertion = ScramCredentialUpsertion::default();
    upsertion.name = StrBytes::from_string(user.to_string());
    upsertion.mechanism = 1; // SCRAM-SHA-256
    upsertion.iterations = 4096;
    upsertion.salt = Bytes::from_static(b"a salt of the client");
    upsertion.salted_password = Bytes::from(salted(password, b"a salt of the client", 4096));
    let mut request = AlterUserScramCredentialsRequest::default();
    request.upsertions = vec![upsertion];
    let response: AlterUserScramCredentialsResponse = client
        .call(ApiKey::AlterUserScramCredentials, 0, &request)
        .await;
    assert_eq!(
        response.results[0].error_code, 0,
        "{:?}",
        response.results[0]
    );
}

async fn handshake(client: &mut Client, mechanism: &str, version: i16) -> SaslHandshakeResponse {
    let mut request = SaslHandshakeRequest::default();
    request.mechanism = StrBytes::from_string(mechanism.to_string());
    client.call(ApiKey::SaslHandshake, version, &request).await
}

async fn authenticate(client: &mut Client, token: &[u8]) -> SaslAuthenticateResponse {
    let mut request = SaslAuthenticateRequest::default();
    request.auth_bytes = Bytes::copy_from_slice(token);
    client.call(ApiKey::SaslAuthenticate, 2, &request).await
}

async fn metadata_answers(client: &mut Client) -> bool {
    client
        .send(ApiKey::Metadata, 12, &MetadataRequest::default())
        .await;
    client.recv_frame().await.is_some()
}

#[tokio::test]
async fn users_made_through_the_admin_api_log_in_with_plain_v0_and_scram() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let admin = start_on(Arc::clone(&store), |_| {}).await;
    create_user(&mut admin.client().await, "alice", "alice-pw").await;
    let mut request = DescribeUserScramCredentialsRequest::default();
    let described: DescribeUserScramCredentialsResponse = admin
        .client()
        .await
        .call(ApiKey::DescribeUserScramCredentials, 0, &request)
        .await;
    assert_eq!(described.results.len(), 1);
    assert_eq!(described.results[0].user.as_str(), "alice");
    assert_eq!(described.results[0].credential_infos[0].mechanism, 1);
    request.users = Some(vec![Default::default(), Default::default()]);
    let duplicated: DescribeUserScramCredentialsResponse = admin
        .client()
        .await
        .call(ApiKey::DescribeUserScramCredentials, 0, &request)
        .await;
    assert_eq!(duplicated.results[0].error_code, 92, "DUPLICATE_RESOURCE");

    let (addr, _stop) = sasl_broker(store).await;
    let connect = || async {
        Client {
            stream: TcpStream::connect(addr).await.unwrap(),
            next_correlation: 1,
        }
    };

    // PLAIN, v0 handshake: the token goes unframed (a length, then the bytes) and the
    // success answer is an empty token.
    let mut client = connect().await;
    assert_eq!(handshake(&mut client, "PLAIN", 0).await.error_code, 0);
    client.send_raw(b"\0alice\0alice-pw").await;
    assert_eq!(client.recv_frame().await.as_deref(), Some(&b""[..]));
    assert!(metadata_answers(&mut client).await);

    // PLAIN v0 with a wrong password: closed without an answer.
    let mut client = connect().await;
    handshake(&mut client, "PLAIN", 0).await;
    client.send_raw(b"\0alice\0wrong").await;
    assert_eq!(client.recv_frame().await, None);

    // SCRAM-SHA-256, framed (SaslAuthenticate v2).
    let mut client = connect().await;
    assert_eq!(
        handshake(&mut client, "SCRAM-SHA-256", 1).await.error_code,
        0
    );
    let first_bare = "n=alice,r=clientnonce";
    let server_first = authenticate(&mut client, format!("n,,{first_bare}").as_bytes()).await;
    assert_eq!(server_first.error_code, 0);
    let server_first = String::from_utf8(server_first.auth_bytes.to_vec()).unwrap();
    let mut fields = server_first.split(',');
    let nonce = fields
        .next()
        .unwrap()
        .strip_prefix("r=")
        .unwrap()
        .to_string();
    let salt = B64
        .decode(fields.next().unwrap().strip_prefix("s=").unwrap())
        .unwrap();
    let iterations: u32 = fields.next().unwrap()[2..].parse().unwrap();
    assert!(nonce.starts_with("clientnonce") && nonce.len() > "clientnonce".len());
    assert_eq!(salt, b"a salt of the client");
    let salted_password = salted("alice-pw", &salt, iterations);
    let client_key = hmac256(&salted_password, b"Client Key");
    let stored_key = Sha256::digest(&client_key);
    let without_proof = format!("c=biws,r={nonce}");
    let auth_message = format!("{first_bare},{server_first},{without_proof}");
    let signature = hmac256(&stored_key, auth_message.as_bytes());
    let proof: Vec<u8> = client_key
        .iter()
        .zip(&signature)
        .map(|(k, s)| k ^ s)
        .collect();
    let last = format!("{without_proof},p={}", B64.encode(proof));
    let server_final = authenticate(&mut client, last.as_bytes()).await;
    assert_eq!(server_final.error_code, 0);
    let server_key = hmac256(&salted_password, b"Server Key");
    let expected = format!(
        "v={}",
        B64.encode(hmac256(&server_key, auth_message.as_bytes()))
    );
    assert_eq!(server_final.auth_bytes.as_ref(), expected.as_bytes());
    assert!(metadata_answers(&mut client).await);

    // An unknown user is told a salt and iterations like anyone, and fails at the end.
    let mut client = connect().await;
    handshake(&mut client, "SCRAM-SHA-256", 1).await;
    let first = authenticate(&mut client, b"n,,n=mallory,r=abc").await;
    assert_eq!(first.error_code, 0);
    assert!(String::from_utf8_lossy(&first.auth_bytes).contains(",s="));
    let refused = authenticate(&mut client, b"c=biws,r=abc,p=AAAA").await;
    assert_eq!(refused.error_code, 58, "SASL_AUTHENTICATION_FAILED");
    assert_eq!(client.recv_frame().await, None);

    // SaslAuthenticate before a handshake: ILLEGAL_SASL_STATE, then closed.
    let mut client = connect().await;
    let early = authenticate(&mut client, b"\0alice\0alice-pw").await;
    assert_eq!(early.error_code, 34);
    assert_eq!(client.recv_frame().await, None);
    admin.shutdown().await;
}
