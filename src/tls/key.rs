//! The client's private key (`sslkey`): a PEM file only its owner may read, decrypted with
//! `sslpassword` when it is an encrypted PKCS#8 key.
//!
//! As libpq: a password given for a key that is not encrypted is ignored, and an encrypted key
//! without one is an error (libpq stopped prompting on the terminal in PostgreSQL 13). No error
//! quotes the password or the key's contents, only the file's path.

use std::path::Path;

use pkcs8::der::pem;
use pkcs8::{EncryptedPrivateKeyInfoRef, PrivateKeyInfoRef};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use super::Secret;
use crate::error::{Error, ErrorKind, Result};

const ENCRYPTED_BEGIN: &[u8] = b"-----BEGIN ENCRYPTED PRIVATE KEY-----";
const ENCRYPTED_END: &[u8] = b"-----END ENCRYPTED PRIVATE KEY-----";
/// The header of OpenSSL's own, older encrypted PEM (`BEGIN RSA PRIVATE KEY` and the like).
const LEGACY_ENCRYPTED: &[u8] = b"Proc-Type: 4,ENCRYPTED";

/// What to tell a user whose key is encrypted in a way pgcoord cannot read.
const CONVERT: &str = "openssl pkcs8 -topk8 -v2 aes-256-cbc";

/// The private key in the file `path`, decrypted with `password` when it is encrypted. As
/// libpq, a key file that its group or others may read is refused (root-owned files may be
/// group-readable): a readable key is a leaked one.
pub(super) fn load(path: &Path, password: Option<&Secret>) -> Result<PrivateKeyDer<'static>> {
    let shown = path.display();
    let meta = std::fs::metadata(path)
        .map_err(|e| invalid(format!("cannot read the client key {shown}: {e}")))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let allowed = if meta.uid() == 0 { 0o640 } else { 0o600 };
        if meta.mode() & 0o777 & !allowed != 0 {
            return Err(invalid(format!(
                "the client key {shown} may be read by others (mode {:o}): make it 0600",
                meta.mode() & 0o777
            )));
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    let text = std::fs::read(path)
        .map_err(|e| invalid(format!("cannot read the client key {shown}: {e}")))?;
    if let Some(block) = section(&text, ENCRYPTED_BEGIN, ENCRYPTED_END) {
        return decrypt(block, path, password);
    }
    if find(&text, LEGACY_ENCRYPTED).is_some() {
        return Err(tls(format!(
            "the client key {shown} is encrypted in OpenSSL's legacy PEM format \
             (Proc-Type: 4,ENCRYPTED), which pgcoord does not read: convert it to encrypted \
             PKCS#8 with `{CONVERT} -in {shown} -out <new file>`"
        )));
    }
    PrivateKeyDer::from_pem_slice(&text)
        .map_err(|e| invalid(format!("no private key in {shown}: {e}")))
}

/// The encrypted PKCS#8 key in the PEM `block`, decrypted with `password`.
fn decrypt(block: &[u8], path: &Path, password: Option<&Secret>) -> Result<PrivateKeyDer<'static>> {
    let shown = path.display();
    let Some(password) = password else {
        return Err(tls(format!(
            "the client key {shown} is encrypted: give its password with sslpassword"
        )));
    };
    // A scheme the crates are built without fails here already, as an unknown identifier.
    let unreadable = |e: &dyn std::fmt::Display| {
        tls(format!(
            "the client key {shown} is encrypted in a way pgcoord does not read ({e}): \
             re-encrypt it with `{CONVERT}`"
        ))
    };
    let (_, der) = pem::decode_vec(block).map_err(|e| unreadable(&e))?;
    let encrypted =
        EncryptedPrivateKeyInfoRef::try_from(der.as_slice()).map_err(|e| unreadable(&e))?;
    let wrong = || {
        tls(format!(
            "the client key {shown} could not be decrypted with sslpassword: wrong password"
        ))
    };
    let plain = encrypted
        .decrypt(password.0.as_bytes())
        .map_err(|e| match e {
            // A wrong password fails the padding check, or — by chance — passes it and leaves
            // bytes that are no key.
            pkcs8::Error::EncryptedPrivateKey(pkcs8::pkcs5::Error::DecryptFailed)
            | pkcs8::Error::Asn1(_)
            | pkcs8::Error::KeyMalformed(_) => wrong(),
            other => unreadable(&other),
        })?;
    PrivateKeyInfoRef::try_from(plain.as_bytes()).map_err(|_| wrong())?;
    Ok(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        plain.as_bytes().to_vec(),
    )))
}

/// The PEM block of `text` from the line `begin` through the line `end`.
fn section<'a>(text: &'a [u8], begin: &[u8], end: &[u8]) -> Option<&'a [u8]> {
    let start = find(text, begin)?;
    let stop = start + find(&text[start..], end)? + end.len();
    Some(&text[start..stop])
}

fn find(text: &[u8], needle: &[u8]) -> Option<usize> {
    text.windows(needle.len())
        .position(|window| window == needle)
}

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidConfig, message)
}

/// A key that cannot be used as it is, whatever is tried again: [`ErrorKind::Tls`].
fn tls(message: String) -> Error {
    Error::new(ErrorKind::Tls, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_found_between_its_lines() {
        let text = b"junk\n-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n\
                     -----END ENCRYPTED PRIVATE KEY-----\nmore";
        let block = section(text, ENCRYPTED_BEGIN, ENCRYPTED_END).unwrap();
        assert!(block.starts_with(ENCRYPTED_BEGIN) && block.ends_with(ENCRYPTED_END));
        assert_eq!(
            section(
                b"-----BEGIN ENCRYPTED PRIVATE KEY-----\n",
                ENCRYPTED_BEGIN,
                ENCRYPTED_END
            ),
            None
        );
    }
}
