//! Byte sizes as kernel developers type them: `4096`, `64K`, `256M`, `1G`, `32G`, `1T`
//! (binary multiples; an optional `iB`/`B` after the suffix is accepted).
use std::fmt;

/// Why a size was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SizeError {
    /// Empty text.
    #[error("empty size: give bytes or a number with K, M, G or T (e.g. 1G)")]
    Empty,
    /// Not a whole non-negative number followed by a known suffix.
    #[error("`{0}` is not a size: use a whole number with an optional K, M, G or T suffix (e.g. 256M)")]
    Malformed(String),
    /// Zero bytes.
    #[error("size must be larger than 0")]
    Zero,
    /// Larger than 2^63 bytes.
    #[error("`{0}` is too large")]
    Overflow(String),
    /// Not a multiple of the base page size.
    #[error("{0} bytes is not a multiple of 4 KiB: every backing maps whole pages")]
    Unaligned(u64),
}

/// Parses a size; the result is non-zero and a multiple of 4 KiB.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(digits_end);
    if digits.is_empty() {
        return Err(SizeError::Malformed(t.to_owned()));
    }
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(SizeError::Malformed(t.to_owned())),
    };
    let n: u64 = digits.parse().map_err(|_| SizeError::Overflow(t.to_owned()))?;
    let bytes = n
        .checked_mul(1u64 << shift)
        .filter(|b| *b <= 1u64 << 63)
        .ok_or_else(|| SizeError::Overflow(t.to_owned()))?;
    if bytes == 0 {
        return Err(SizeError::Zero);
    }
    if bytes % 4096 != 0 {
        return Err(SizeError::Unaligned(bytes));
    }
    Ok(bytes)
}

/// A size printed the way it was most likely typed (`1 GiB`, `256 MiB`, `12288 B`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanSize(pub u64);

impl fmt::Display for HumanSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
        for (shift, unit) in UNITS {
            if self.0 >= 1 << shift && self.0.is_multiple_of(1 << shift) {
                return write!(f, "{} {unit}", self.0 >> shift);
            }
        }
        write!(f, "{} B", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("32g"), Ok(32 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size(" 1T "), Ok(1 << 40));
    }

    #[test]
    fn bad_sizes() {
        for bad in ["", "G", "-1G", "1.5G", "10X", "1 G", "0x10", "ten"] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(parse_size("0"), Err(SizeError::Zero));
        assert_eq!(parse_size("0G"), Err(SizeError::Zero));
        assert_eq!(parse_size("100"), Err(SizeError::Unaligned(100)));
        assert!(matches!(
            parse_size("99999999999999999999"),
            Err(SizeError::Overflow(_))
        ));
        assert!(matches!(parse_size("16777216T"), Err(SizeError::Overflow(_))));
        assert!(matches!(parse_size("9000000000T"), Err(SizeError::Overflow(_))));
    }

    #[test]
    fn human() {
        assert_eq!(HumanSize(1 << 30).to_string(), "1 GiB");
        assert_eq!(HumanSize(3 << 20).to_string(), "3 MiB");
        assert_eq!(HumanSize(12288).to_string(), "12 KiB");
        assert_eq!(HumanSize(100).to_string(), "100 B");
    }
}
