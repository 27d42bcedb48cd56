//! A shared secret a client presents in its hello, compared in constant time.

use core::fmt;
use core::hint::black_box;

use super::error::WireError;
use super::layout::MAX_TOKEN_LEN;

/// A shared token of 1 to [`MAX_TOKEN_LEN`] bytes.
///
/// A server configured with one reveals nothing to a client whose hello
/// lacks it. It travels in clear text, so it keeps out port scanners and
/// strangers on a network you trust, not an eavesdropper: put TLS under
/// the exchange for that. Use random bytes (16 or more), not a word.
///
/// Stored inline (no allocation) and zero-padded, so comparing two tokens
/// always touches all [`MAX_TOKEN_LEN`] bytes of both: `==` takes the
/// same time wherever, and whether, they differ. `Debug` never shows
/// the bytes.
#[derive(Clone, Copy)]
pub struct Token {
    bytes: [u8; MAX_TOKEN_LEN],
    len: u8,
}

impl Token {
    /// A token holding a copy of `bytes`, which must be 1 to
    /// [`MAX_TOKEN_LEN`] bytes long (an empty token would be no secret).
    pub fn new(bytes: &[u8]) -> Result<Token, WireError> {
        if bytes.is_empty() {
            return Err(WireError::Inconsistent("a token must not be empty"));
        }
        let len = u8::try_from(bytes.len())
            .ok()
            .filter(|&n| usize::from(n) <= MAX_TOKEN_LEN)
            .ok_or(WireError::Inconsistent("token longer than 64 bytes"))?;
        let mut token = Token {
            bytes: [0; MAX_TOKEN_LEN],
            len,
        };
        token.bytes[..bytes.len()].copy_from_slice(bytes);
        Ok(token)
    }

    /// The token's bytes, as they travel on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Constant-time equality: the lengths and all [`MAX_TOKEN_LEN`]
    /// padded bytes are folded into one difference before it is tested,
    /// so the time taken says nothing about where the tokens differ.
    /// `black_box` on every byte keeps the optimiser from turning the
    /// fold back into an early exit (best effort, as in any Rust code
    /// without assembly).
    pub fn ct_eq(&self, other: &Token) -> bool {
        let mut diff = self.len ^ other.len;
        for (a, b) in self.bytes.iter().zip(other.bytes.iter()) {
            diff |= black_box(a ^ b);
        }
        black_box(diff) == 0
    }
}

impl PartialEq for Token {
    /// [`Token::ct_eq`]: never exits early.
    fn eq(&self, other: &Token) -> bool {
        self.ct_eq(other)
    }
}

impl Eq for Token {}

impl fmt::Debug for Token {
    /// The length only: a secret must not end up in a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({} bytes, redacted)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    #[test]
    fn lengths() {
        assert!(Token::new(b"").is_err());
        assert!(Token::new(&[7; MAX_TOKEN_LEN + 1]).is_err());
        assert!(
            Token::new(&[0; 300]).is_err(),
            "u8 wrap must not sneak past"
        );
        let t = Token::new(&[7; MAX_TOKEN_LEN]).unwrap();
        assert_eq!(t.as_bytes(), &[7; MAX_TOKEN_LEN]);
        assert_eq!(Token::new(b"ab").unwrap().as_bytes(), b"ab");
    }

    #[test]
    fn equality() {
        let t = |b: &[u8]| Token::new(b).unwrap();
        assert_eq!(t(b"secret"), t(b"secret"));
        assert_ne!(t(b"secret"), t(b"secreT"));
        assert_ne!(t(b"secret"), t(b"Secret"));
        // Padding is zero, so only the length tells these apart.
        assert_ne!(t(b"secret"), t(b"secret\0"));
        assert_ne!(t(b"s"), t(b"secret"));
    }

    #[test]
    fn debug_hides_the_bytes() {
        let shown = format!("{:?}", Token::new(b"hunter2").unwrap());
        assert_eq!(shown, "Token(7 bytes, redacted)");
    }
}
