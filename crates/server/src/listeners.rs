//! Kafka-style listener settings: `listeners`, `advertised_listeners` and
//! `listener_security_protocol_map`, parsed and checked against each other.
//!
//! ```text
//! listeners = "PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9094"
//! advertised_listeners = "PLAINTEXT://localhost:9092,SASL_SSL://broker.example.com:9094"
//! listener_security_protocol_map = "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL"
//! ```

use std::net::SocketAddr;

use strata_broker::security::SecurityProtocol;

use crate::settings::parse_host_port;

/// One listener to bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerSpec {
    pub name: String,
    pub protocol: SecurityProtocol,
    pub bind: SocketAddr,
    /// `host:port` clients are told; None: derived from the bound address.
    pub advertised: Option<(String, u16)>,
}

/// Kafka's default map: each protocol's name is a listener name of that protocol.
pub const DEFAULT_PROTOCOL_MAP: &str =
    "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL";

fn entries(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|e| !e.is_empty())
}

fn split_url(entry: &str) -> Result<(String, &str), String> {
    let (name, address) = entry
        .split_once("://")
        .ok_or_else(|| format!("{entry:?} is not NAME://host:port"))?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("{entry:?}: bad listener name {name:?}"));
    }
    Ok((name.to_ascii_uppercase(), address))
}

/// The protocol map: listener name → protocol.
pub fn parse_protocol_map(text: &str) -> Result<Vec<(String, SecurityProtocol)>, String> {
    let mut map = Vec::new();
    for entry in entries(text) {
        let (name, protocol) = entry
            .split_once(':')
            .ok_or_else(|| format!("{entry:?} is not NAME:PROTOCOL"))?;
        let protocol =
            SecurityProtocol::from_name(&protocol.to_ascii_uppercase()).ok_or_else(|| {
                format!("{entry:?}: {protocol:?} is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
            })?;
        let name = name.to_ascii_uppercase();
        if map.iter().any(|(n, _)| *n == name) {
            return Err(format!("listener {name} is mapped twice"));
        }
        map.push((name, protocol));
    }
    Ok(map)
}

/// Every listener of `listeners`, with its protocol from `map` and its advertised endpoint
/// from `advertised` (if given).
pub fn parse(
    listeners: &str,
    advertised: Option<&str>,
    map: &str,
) -> Result<Vec<ListenerSpec>, (&'static str, String)> {
    let map = parse_protocol_map(map).map_err(|e| ("listener_security_protocol_map", e))?;
    let mut specs: Vec<ListenerSpec> = Vec::new();
    for entry in entries(listeners) {
        let (name, address) = split_url(entry).map_err(|e| ("listeners", e))?;
        let bind = address
            .parse::<SocketAddr>()
            .or_else(|_| {
                // `localhost:9092` and the like: bind what the name resolves to first.
                std::net::ToSocketAddrs::to_socket_addrs(address)
                    .map_err(|e| e.to_string())
                    .and_then(|mut a| a.next().ok_or_else(|| "no address".to_string()))
            })
            .map_err(|e| ("listeners", format!("{entry:?}: {e}")))?;
        let protocol = map
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| *p)
            .ok_or_else(|| {
                (
                    "listener_security_protocol_map",
                    format!("listener {name} has no security protocol in the map"),
                )
            })?;
        if specs.iter().any(|s| s.name == name) {
            return Err(("listeners", format!("listener {name} is named twice")));
        }
        specs.push(ListenerSpec {
            name,
            protocol,
            bind,
            advertised: None,
        });
    }
    if specs.is_empty() {
        return Err(("listeners", "names no listener".into()));
    }
    for entry in entries(advertised.unwrap_or("")) {
        let (name, address) = split_url(entry).map_err(|e| ("advertised_listeners", e))?;
        let endpoint = parse_host_port(address).map_err(|e| ("advertised_listeners", e))?;
        let spec = specs.iter_mut().find(|s| s.name == name).ok_or_else(|| {
            (
                "advertised_listeners",
                format!("{name} is not one of the listeners"),
            )
        })?;
        spec.advertised = Some(endpoint);
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_style_listeners_parse_with_the_default_map() {
        let specs = parse(
            "PLAINTEXT://127.0.0.1:9092, SASL_SSL://0.0.0.0:9094",
            Some("SASL_SSL://broker.example.com:19094"),
            DEFAULT_PROTOCOL_MAP,
        )
        .unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].protocol, SecurityProtocol::Plaintext);
        assert_eq!(specs[0].advertised, None);
        assert_eq!(specs[1].name, "SASL_SSL");
        assert_eq!(specs[1].protocol, SecurityProtocol::SaslSsl);
        assert_eq!(specs[1].bind, "0.0.0.0:9094".parse().unwrap());
        assert_eq!(
            specs[1].advertised,
            Some(("broker.example.com".to_string(), 19094))
        );
    }

    #[test]
    fn named_listeners_take_their_protocol_from_the_map() {
        let specs = parse(
            "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
            None,
            "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL",
        )
        .unwrap();
        assert_eq!(specs[0].protocol, SecurityProtocol::Plaintext);
        assert_eq!(specs[1].protocol, SecurityProtocol::SaslSsl);
    }

    #[test]
    fn mistakes_name_the_setting_at_fault() {
        let key = |l: &str, a: Option<&str>, m: &str| parse(l, a, m).unwrap_err().0;
        assert_eq!(
            key("EXTERNAL://127.0.0.1:1", None, DEFAULT_PROTOCOL_MAP),
            "listener_security_protocol_map"
        );
        assert_eq!(
            key("PLAINTEXT://nowhere", None, DEFAULT_PROTOCOL_MAP),
            "listeners"
        );
        assert_eq!(
            key("127.0.0.1:9092", None, DEFAULT_PROTOCOL_MAP),
            "listeners"
        );
        assert_eq!(
            key(
                "PLAINTEXT://127.0.0.1:1,PLAINTEXT://127.0.0.1:2",
                None,
                DEFAULT_PROTOCOL_MAP
            ),
            "listeners"
        );
        assert_eq!(
            key(
                "PLAINTEXT://127.0.0.1:1",
                Some("SSL://h:1"),
                DEFAULT_PROTOCOL_MAP
            ),
            "advertised_listeners"
        );
        assert_eq!(
            key(
                "PLAINTEXT://127.0.0.1:1",
                Some("PLAINTEXT://h:0"),
                DEFAULT_PROTOCOL_MAP
            ),
            "advertised_listeners"
        );
        assert_eq!(
            key("A://127.0.0.1:1", None, "A:TLS"),
            "listener_security_protocol_map"
        );
        assert_eq!(key("", None, DEFAULT_PROTOCOL_MAP), "listeners");
    }
}
