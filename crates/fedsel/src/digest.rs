//! Hex digests of byte slices.
//!
//! A module of its own so that every module that checks or keys by a digest (data files,
//! checkpoints, config hashes) can use it without importing another's domain.

/// Hex SHA-256 of a byte slice (checksums, config hashes).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(bytes))
}

/// Hex MD5 of a byte slice (CIFAR publishes MD5s).
pub(crate) fn md5_hex(bytes: &[u8]) -> String {
    use md5::Digest;
    hex(&md5::Md5::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
