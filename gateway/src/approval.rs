//! Approvals of `always_ask` calls, as signed tokens: an approver's
//! `Approve` returns a token binding the session, the tool, the exact input
//! (and, if given, the call id) and an expiry of at most ten minutes; the
//! caller repeats the call with it. Nothing is stored, so any gateway
//! replica honours a token another made: the key is derived from the
//! gateway's own TLS key, which every replica mounts from one Secret.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::address::SessionAddr;
use crate::error::{Error, Result};

/// How long an approval stays good.
pub const APPROVAL_SECONDS: i64 = 600;

/// Signs and checks approvals.
pub struct Approvals {
    key: [u8; 32],
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals").finish_non_exhaustive()
    }
}

/// What an approval is for.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub addr: &'a SessionAddr,
    pub tool: &'a str,
    pub input: &'a serde_json::Value,
    pub id: Option<&'a str>,
}

impl Approvals {
    /// Keyed by `secret` (the gateway's TLS key): the same on every replica.
    pub fn new(secret: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(b"agentplane approvals v1\0");
        h.update(secret);
        Self {
            key: h.finalize().into(),
        }
    }

    fn mac(&self, subject: &Subject<'_>, expires: i64) -> Vec<u8> {
        // Infallible: HMAC takes a key of any length.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        let input = canonical(subject.input);
        for part in [
            subject.addr.namespace.as_bytes(),
            subject.addr.name.as_bytes(),
            subject.tool.as_bytes(),
            &Sha256::digest(input.as_bytes()),
            subject.id.unwrap_or("").as_bytes(),
            expires.to_string().as_bytes(),
        ] {
            m.update(&(part.len() as u64).to_be_bytes());
            m.update(part);
        }
        m.finalize().into_bytes().to_vec()
    }

    /// A token for `subject`, good until `now + APPROVAL_SECONDS`.
    pub fn issue(&self, subject: &Subject<'_>, now: i64) -> (String, i64) {
        let expires = now + APPROVAL_SECONDS;
        let mac = self.mac(subject, expires);
        (
            format!("v1.{expires}.{}", URL_SAFE_NO_PAD.encode(mac)),
            expires,
        )
    }

    /// Whether `token` approves `subject` now.
    pub fn check(&self, token: &str, subject: &Subject<'_>, now: i64) -> Result<()> {
        let bad = |why: &str| Error::Invalid(format!("the approval is not valid: {why}"));
        if token.len() > 256 {
            return Err(bad("too long"));
        }
        let mut parts = token.splitn(3, '.');
        let (Some("v1"), Some(exp), Some(mac)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("not an approval token"));
        };
        let expires: i64 = exp.parse().map_err(|_| bad("malformed expiry"))?;
        let given = URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| bad("malformed signature"))?;
        let want = self.mac(subject, expires);
        if !constant_eq(&given, &want) {
            return Err(bad(
                "it was given for another session, tool, input or call id, or by another gateway",
            ));
        }
        if expires < now {
            return Err(bad("it expired; ask for a new one"));
        }
        if expires > now + APPROVAL_SECONDS + 60 {
            return Err(bad("its expiry is later than any approval's"));
        }
        Ok(())
    }
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// JSON with object keys sorted at every level: the same input sent with
/// its keys in another order is the same call.
pub fn canonical(v: &serde_json::Value) -> String {
    fn sorted(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                serde_json::Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&m[k])))
                        .collect(),
                )
            }
            serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(v).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn addr() -> SessionAddr {
        SessionAddr::new("team-a", "demo").expect("addr")
    }

    #[test]
    fn an_approval_is_good_for_its_call_only_and_for_ten_minutes() {
        let a = Approvals::new(b"key");
        let addr = addr();
        let input = json!({"command": "rm -rf build", "timeout_ms": 1000});
        let s = Subject {
            addr: &addr,
            tool: "bash",
            input: &input,
            id: None,
        };
        let (token, exp) = a.issue(&s, 1_000);
        assert_eq!(exp, 1_600);
        a.check(&token, &s, 1_000).expect("good");
        // The same input with its keys in another order.
        let reordered = json!({"timeout_ms": 1000, "command": "rm -rf build"});
        a.check(
            &token,
            &Subject {
                input: &reordered,
                ..s
            },
            1_000,
        )
        .expect("same call");
        let other = json!({"command": "rm -rf /"});
        assert!(
            a.check(&token, &Subject { input: &other, ..s }, 1_000)
                .is_err()
        );
        assert!(
            a.check(&token, &Subject { tool: "write", ..s }, 1_000)
                .is_err()
        );
        let elsewhere = SessionAddr::new("team-b", "demo").expect("addr");
        assert!(
            a.check(
                &token,
                &Subject {
                    addr: &elsewhere,
                    ..s
                },
                1_000
            )
            .is_err()
        );
        assert!(a.check(&token, &s, 1_601).is_err(), "expired");
        assert!(Approvals::new(b"other").check(&token, &s, 1_000).is_err());
        // A forged expiry breaks the signature.
        let forged = token.replacen("1600", "9999", 1);
        assert!(a.check(&forged, &s, 1_000).is_err());
        for junk in ["", "v1", "v1.x.y", "v2.1.AA", &"x".repeat(1000)] {
            assert!(a.check(junk, &s, 1_000).is_err(), "{junk}");
        }
    }

    #[test]
    fn an_approval_for_a_call_id_is_for_that_id() {
        let a = Approvals::new(b"key");
        let addr = addr();
        let input = json!({});
        let s = Subject {
            addr: &addr,
            tool: "bash",
            input: &input,
            id: Some("call-1"),
        };
        let (token, _) = a.issue(&s, 0);
        assert!(a.check(&token, &s, 0).is_ok());
        assert!(
            a.check(
                &token,
                &Subject {
                    id: Some("call-2"),
                    ..s
                },
                0
            )
            .is_err()
        );
        assert!(a.check(&token, &Subject { id: None, ..s }, 0).is_err());
    }
}
