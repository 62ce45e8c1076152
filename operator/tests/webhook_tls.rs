//! The webhook's certificate is reloaded when its files change, and a
//! broken replacement keeps the certificate in service.

use operator::admission::tls::{ReloadingCert, TlsFiles};

fn pair(name: &str) -> (String, String, Vec<u8>) {
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec![name.to_owned()]).expect("params");
    let cert = params.self_signed(&key).expect("cert");
    (cert.pem(), key.serialize_pem(), cert.der().to_vec())
}

#[test]
fn reloads_on_change_and_keeps_the_old_pair_when_the_new_one_is_broken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    let (a_pem, a_key, a_der) = pair("a.example");
    std::fs::write(&files.cert, &a_pem).expect("write");
    std::fs::write(&files.key, &a_key).expect("write");
    let cert = ReloadingCert::load(files.clone()).expect("loads");
    assert_eq!(cert.leaf_der(), Some(a_der.clone()));
    assert!(
        !cert.reload().expect("same files"),
        "unchanged files are not a reload"
    );

    let (b_pem, b_key, b_der) = pair("b.example");
    std::fs::write(&files.cert, &b_pem).expect("write");
    std::fs::write(&files.key, &b_key).expect("write");
    assert!(cert.reload().expect("new pair"));
    assert_eq!(cert.leaf_der(), Some(b_der.clone()));

    std::fs::write(&files.cert, "not a certificate").expect("write");
    let err = cert.reload().expect_err("broken");
    assert!(err.to_string().contains("tls.crt"), "{err}");
    assert_eq!(cert.leaf_der(), Some(b_der), "the served certificate stays");
}

#[test]
fn missing_files_name_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = TlsFiles {
        cert: dir.path().join("nope.crt"),
        key: dir.path().join("nope.key"),
    };
    let err = ReloadingCert::load(files).expect_err("missing");
    assert!(err.to_string().contains("nope.crt"), "{err}");
}
