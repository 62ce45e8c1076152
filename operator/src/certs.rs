//! The platform's certificate authority for the gateway <-> runner link.
//!
//! The operator keeps one CA (a Secret in its own namespace, made on first
//! start) and issues from it:
//! - a runner certificate per tenant namespace, for **server** authentication
//!   only, naming [`runner_api::RUNNER_TLS_NAME`] (runners are reached by pod
//!   IP, which no certificate could name ahead of time);
//! - the gateway's certificate, for server **and client** authentication.
//!
//! A runner accepts only client certificates from this CA issued for client
//! authentication, so the key of a runner certificate -- readable by the
//! sandbox and by the tenant's namespace admin -- cannot call any runner.
//! Pure: no I/O; the Secrets are written by [`crate::tls_secrets`].

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

use crate::error::{Error, Result};

/// The CA's common name; also how an issuer is rebuilt from the stored key
/// (the issuer's name must equal the CA certificate's subject).
const CA_NAME: &str = "agentplane runner CA";
/// How long the CA is valid.
const CA_DAYS: i64 = 3650;
/// How long an issued certificate is valid; the operator renews one that
/// has less than [`RENEW_BEFORE_DAYS`] left.
pub const LEAF_DAYS: i64 = 365;
/// A certificate with less than this left is issued again.
pub const RENEW_BEFORE_DAYS: i64 = 30;

/// A certificate and its key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
    /// When the certificate stops being valid (Unix seconds).
    pub not_after: i64,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Pair")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

fn ca_params() -> Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(p)
}

fn tls(e: rcgen::Error) -> Error {
    Error::Tls(format!("certificate: {e}"))
}

fn validity(p: &mut CertificateParams, now: OffsetDateTime, days: i64) -> i64 {
    p.not_before = now - Duration::hours(1);
    p.not_after = now + Duration::days(days);
    p.not_after.unix_timestamp()
}

/// A new CA.
pub fn new_ca(now: OffsetDateTime) -> Result<Pair> {
    let key = KeyPair::generate().map_err(tls)?;
    let mut p = ca_params()?;
    let not_after = validity(&mut p, now, CA_DAYS);
    let cert = p.self_signed(&key).map_err(tls)?;
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after,
    })
}

fn issue(
    ca: &Pair,
    names: &[String],
    usages: &[ExtendedKeyUsagePurpose],
    now: OffsetDateTime,
) -> Result<Pair> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(tls)?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let key = KeyPair::generate().map_err(tls)?;
    let mut p = CertificateParams::new(names.to_vec()).map_err(tls)?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        names.first().map_or("agentplane", String::as_str),
    );
    p.distinguished_name = dn;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = usages.to_vec();
    p.use_authority_key_identifier_extension = true;
    let not_after = validity(&mut p, now, LEAF_DAYS);
    let cert = p.signed_by(&key, &issuer).map_err(tls)?;
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after,
    })
}

/// A runner's certificate: server authentication only.
pub fn runner_cert(ca: &Pair, now: OffsetDateTime) -> Result<Pair> {
    issue(
        ca,
        &[runner_api::RUNNER_TLS_NAME.to_owned()],
        &[ExtendedKeyUsagePurpose::ServerAuth],
        now,
    )
}

/// The gateway's certificate: it serves its callers under `dns_names` and
/// is the client runners accept.
pub fn gateway_cert(ca: &Pair, dns_names: &[String], now: OffsetDateTime) -> Result<Pair> {
    if dns_names.is_empty() {
        return Err(Error::Tls(
            "the gateway's certificate needs at least one DNS name".into(),
        ));
    }
    issue(
        ca,
        dns_names,
        &[
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        now,
    )
}

/// The operator's own client certificate towards runners and checkpoint
/// sinks: client authentication only, never stored (it is minted in
/// memory, for one checkpoint, and valid for [`CLIENT_HOURS`]).
pub fn operator_client_cert(ca: &Pair, now: OffsetDateTime) -> Result<Pair> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(tls)?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let key = KeyPair::generate().map_err(tls)?;
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "agentplane-operator");
    p.distinguished_name = dn;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    p.use_authority_key_identifier_extension = true;
    p.not_before = now - Duration::minutes(5);
    p.not_after = now + Duration::hours(CLIENT_HOURS);
    let not_after = p.not_after.unix_timestamp();
    let cert = p.signed_by(&key, &issuer).map_err(tls)?;
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after,
    })
}

/// How long the operator's in-memory client certificate is valid.
pub const CLIENT_HOURS: i64 = 2;

/// Whether a certificate valid until `not_after` should be issued again.
pub fn due(not_after: i64, now: OffsetDateTime) -> bool {
    not_after - now.unix_timestamp() < RENEW_BEFORE_DAYS * 86_400
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_carry_the_usages_that_keep_a_runner_key_from_calling_runners() {
        let now = OffsetDateTime::now_utc();
        let ca = new_ca(now).expect("ca");
        let runner = runner_cert(&ca, now).expect("runner");
        let gw = gateway_cert(&ca, &["gw.example".into()], now).expect("gw");
        // Parse back with rustls' own view of the chain: the runner
        // certificate verifies as a server, not as a client.
        let roots = {
            let mut r = rustls::RootCertStore::empty();
            for c in rustls_pemfile::certs(&mut ca.cert_pem.as_bytes()) {
                r.add(c.expect("ca der")).expect("add");
            }
            std::sync::Arc::new(r)
        };
        let client_verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .expect("verifier");
        let der = |p: &Pair| {
            rustls_pemfile::certs(&mut p.cert_pem.as_bytes())
                .next()
                .expect("one")
                .expect("der")
        };
        let now_ut = rustls::pki_types::UnixTime::now();
        assert!(
            client_verifier
                .verify_client_cert(&der(&gw), &[], now_ut)
                .is_ok(),
            "the gateway is a client"
        );
        assert!(
            client_verifier
                .verify_client_cert(&der(&runner), &[], now_ut)
                .is_err(),
            "a runner certificate is not a client"
        );
        assert!(!due(runner.not_after, now));
        assert!(due(runner.not_after, now + Duration::days(LEAF_DAYS - 1)));
        assert!(format!("{runner:?}").find("PRIVATE").is_none());
    }

    #[test]
    fn the_operators_client_certificate_is_a_client_only() {
        let now = OffsetDateTime::now_utc();
        let ca = new_ca(now).expect("ca");
        let op = operator_client_cert(&ca, now).expect("client");
        assert!(op.not_after <= (now + Duration::hours(CLIENT_HOURS)).unix_timestamp());
        assert!(format!("{op:?}").find("PRIVATE").is_none());
    }

    #[test]
    fn a_gateway_certificate_needs_a_name() {
        let now = OffsetDateTime::now_utc();
        let ca = new_ca(now).expect("ca");
        assert!(gateway_cert(&ca, &[], now).is_err());
    }
}
