//! A throwaway cluster with TLS on: a [`CertificateAuthority`] made for the run signs the
//! server's certificate, and clients trust that authority's certificate
//! ([`TempPostgres::root_cert`]). Tests make a second authority to see a certificate refused.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::TempPostgres;
use pgcoord::error::{Error, ErrorKind, Result};

/// The role a TLS cluster lets in only with a client certificate (`cert` in `pg_hba.conf`):
/// [`TempPostgres::client_cert`] is one for it. Create the role to use it.
pub const CERT_USER: &str = "pgcoord_cert";

/// The names the throwaway server's certificate is valid for.
const SERVER_NAMES: &[&str] = &["localhost", "127.0.0.1"];

/// A certificate authority that exists for one run: it signs server certificates, and its
/// certificate is what clients trust.
pub struct CertificateAuthority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl CertificateAuthority {
    /// A new authority with a new key, named `name` (its common name).
    pub fn new(name: &str) -> Result<CertificateAuthority> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(certificate)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().map_err(certificate)?;
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(certificate)?;
        Ok(CertificateAuthority { issuer })
    }

    /// The authority's certificate, PEM-encoded: what a client given it trusts.
    pub fn certificate_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `names` (host names or IP addresses) signed by this authority:
    /// (certificate, private key), both PEM-encoded.
    pub fn issue(&self, names: &[&str]) -> Result<(String, String)> {
        let names: Vec<String> = names.iter().map(|&n| n.to_owned()).collect();
        let mut params = CertificateParams::new(names).map_err(certificate)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "pgcoord throwaway server");
        let key = KeyPair::generate().map_err(certificate)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(certificate)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// A client certificate for the role `user` (its common name, which the `cert` method
    /// matches) signed by this authority: (certificate, private key), both PEM-encoded.
    pub fn issue_client(&self, user: &str) -> Result<(String, String)> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(certificate)?;
        params.distinguished_name.push(DnType::CommonName, user);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().map_err(certificate)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(certificate)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

impl TempPostgres {
    /// As [`start`](Self::start), with TLS on: the server's certificate is for `localhost` and
    /// `127.0.0.1`, signed by a [`CertificateAuthority`] made for this cluster, whose
    /// certificate is [`root_cert`](Self::root_cert). Plain connections are still accepted
    /// (clients choose with `sslmode`).
    pub fn start_tls() -> Result<TempPostgres> {
        let mut server = Self::initialized(&[])?;
        let authority = CertificateAuthority::new("pgcoord throwaway CA")?;
        let (cert, key) = authority.issue(SERVER_NAMES)?;
        let dir = server.directory().to_owned();
        let root = dir.join("root.crt");
        write(&root, &authority.certificate_pem(), 0o644, None)?;
        // The server refuses a key file that others can read, or that is not its user's.
        write(&dir.join("server.crt"), &cert, 0o644, server.user)?;
        write(&dir.join("server.key"), &key, 0o600, server.user)?;
        // Client certificates: signed by the same authority; the role CERT_USER must show one.
        let (client_cert, client_key) = authority.issue_client(CERT_USER)?;
        let (client_crt, client_key_path) = (dir.join("client.crt"), dir.join("client.key"));
        write(&client_crt, &client_cert, 0o644, None)?;
        write(&client_key_path, &client_key, 0o600, None)?;
        server.prepend_hba(&format!(
            "hostssl all {CERT_USER} 127.0.0.1/32 cert\nhost all {CERT_USER} 127.0.0.1/32 reject\n"
        ))?;
        server.client_cert = Some((client_crt, client_key_path));
        server.settings.extend([
            ("ssl".to_owned(), "on".to_owned()),
            (
                "ssl_ca_file".to_owned(),
                dir.join("root.crt").display().to_string(),
            ),
            (
                "ssl_cert_file".to_owned(),
                dir.join("server.crt").display().to_string(),
            ),
            (
                "ssl_key_file".to_owned(),
                dir.join("server.key").display().to_string(),
            ),
        ]);
        server.root_cert = Some(root);
        server.launch()?;
        Ok(server)
    }

    /// The certificate (PEM file) of the authority that signed the server's certificate, when
    /// the server was started with TLS ([`start_tls`](Self::start_tls)): give it as
    /// `sslrootcert`.
    pub fn root_cert(&self) -> Option<&Path> {
        self.root_cert.as_deref()
    }

    /// A client certificate and its key (PEM files, the key `0600`) that the server accepts
    /// for the role [`CERT_USER`], when it was started with TLS: give them as `sslcert` and
    /// `sslkey`. Connections as that role without one are refused.
    pub fn client_cert(&self) -> Option<(&Path, &Path)> {
        self.client_cert
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()))
    }
}

pub(crate) fn write(
    path: &PathBuf,
    contents: &str,
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<()> {
    let failed = |e: std::io::Error| {
        Error::new(
            ErrorKind::Other,
            format!("cannot write {}: {e}", path.display()),
        )
        .with_source(e)
    };
    fs::write(path, contents).map_err(failed)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(failed)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(failed)?;
    }
    Ok(())
}

fn certificate(e: rcgen::Error) -> Error {
    Error::new(
        ErrorKind::Other,
        format!("cannot make a test certificate: {e}"),
    )
}
