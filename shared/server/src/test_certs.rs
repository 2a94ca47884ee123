//! Certificates for tests of TLS setups: a CA, and server and client certificates it
//! signed, written as PEM files into a directory (feature `test-certs`).

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair};
use std::path::{Path, PathBuf};

/// PEM files: `ca.crt`, `server.crt`/`server.key` (for `127.0.0.1` and `localhost`),
/// `client.crt`/`client.key`.
pub struct TestCerts {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// Writes a fresh CA and the certificates it signed into `dir`.
pub fn write(dir: &Path) -> Result<TestCerts, Box<dyn std::error::Error>> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name = common_name("Strata test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let mut out = TestCerts {
        ca: dir.join("ca.crt"),
        server_cert: dir.join("server.crt"),
        server_key: dir.join("server.key"),
        client_cert: dir.join("client.crt"),
        client_key: dir.join("client.key"),
    };
    std::fs::write(&out.ca, ca.pem())?;
    for (names, cert, key) in [
        (vec!["127.0.0.1".to_string(), "localhost".to_string()], &mut out.server_cert, &mut out.server_key),
        (vec!["client".to_string()], &mut out.client_cert, &mut out.client_key),
    ] {
        let k = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.clone())?;
        // A subject distinct from the CA's: OpenSSL takes subject == issuer for self-signed.
        params.distinguished_name = common_name(&names[0]);
        let c = params.signed_by(&k, &ca)?;
        std::fs::write(&*cert, c.pem())?;
        std::fs::write(&*key, k.serialize_pem())?;
    }
    Ok(out)
}

fn common_name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}
