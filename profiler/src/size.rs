//! Byte sizes as kernel developers type them: `4096`, `64K`, `256M`, `1G`, `32G`, `1T`
//! (binary multiples; an optional `iB`/`B` after the suffix is accepted).
//!
//! [`ByteSize`] is the one size type of the workspace: `dmaprof -b`, the workload, and xtask's
//! `--mem`/`--size` options all carry it (xtask compiles this file too, so it depends on
//! nothing but `std` and `thiserror`).
use std::{fmt, str::FromStr};

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

/// The base page size every size is a multiple of.
pub const BASE_PAGE: u64 = 4096;

/// A validated size in bytes: non-zero, at most 2^63, a multiple of 4 KiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(u64);

impl ByteSize {
    /// `bytes` as a size, if it is a valid one.
    pub fn new(bytes: u64) -> Result<Self, SizeError> {
        if bytes == 0 {
            return Err(SizeError::Zero);
        }
        if bytes > 1u64 << 63 {
            return Err(SizeError::Overflow(bytes.to_string()));
        }
        if !bytes.is_multiple_of(BASE_PAGE) {
            return Err(SizeError::Unaligned(bytes));
        }
        Ok(Self(bytes))
    }

    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// The size in whole MiB, rounded down (QEMU's `-m` unit).
    pub const fn mib(self) -> u64 {
        self.0 >> 20
    }

    /// Whether the size is a whole number of `page`-byte pages.
    pub fn is_multiple_of(self, page: u64) -> bool {
        page != 0 && self.0.is_multiple_of(page)
    }

    /// The size as `-b` takes it, without spaces (`64M`, `1G`, `12K`): for names and paths.
    pub fn short(self) -> String {
        HumanSize(self.0)
            .to_string()
            .replace(" TiB", "T")
            .replace(" GiB", "G")
            .replace(" MiB", "M")
            .replace(" KiB", "K")
            .replace(" B", "")
    }

    /// The number of `page`-byte pages (rounded down).
    pub fn pages(self, page: u64) -> u64 {
        self.0 / page.max(1)
    }
}

impl FromStr for ByteSize {
    type Err = SizeError;

    fn from_str(text: &str) -> Result<Self, SizeError> {
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
        Self::new(bytes)
    }
}

/// Parses a size; the result is non-zero and a multiple of 4 KiB.
pub fn parse_size(text: &str) -> Result<ByteSize, SizeError> {
    text.parse()
}

/// Printed the way it was most likely typed (`1 GiB`, `256 MiB`, `12 KiB`).
impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        HumanSize(self.0).fmt(f)
    }
}

/// Any byte count printed the way it was most likely typed (`1 GiB`, `256 MiB`, `12288 B`),
/// for values that are not sizes a user chose (memory available, page sizes).
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

    fn bytes(s: &str) -> Result<u64, SizeError> {
        parse_size(s).map(ByteSize::bytes)
    }

    #[test]
    fn short_names_parse_back() {
        for t in ["64M", "1G", "12K", "1536M", "3T"] {
            assert_eq!(parse_size(t).unwrap().short(), t);
        }
    }

    #[test]
    fn good_sizes() {
        assert_eq!(bytes("4096"), Ok(4096));
        assert_eq!(bytes("64K"), Ok(64 << 10));
        assert_eq!(bytes("256M"), Ok(256 << 20));
        assert_eq!(bytes("1G"), Ok(1 << 30));
        assert_eq!(bytes("32g"), Ok(32 << 30));
        assert_eq!(bytes("2GiB"), Ok(2 << 30));
        assert_eq!(bytes(" 1T "), Ok(1 << 40));
    }

    #[test]
    fn bad_sizes() {
        for bad in ["", "G", "-1G", "1.5G", "10X", "1 G", "0x10", "ten"] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(bytes("0"), Err(SizeError::Zero));
        assert_eq!(bytes("0G"), Err(SizeError::Zero));
        assert_eq!(bytes("100"), Err(SizeError::Unaligned(100)));
        assert!(matches!(bytes("99999999999999999999"), Err(SizeError::Overflow(_))));
        assert!(matches!(bytes("16777216T"), Err(SizeError::Overflow(_))));
        assert!(matches!(bytes("9000000000T"), Err(SizeError::Overflow(_))));
        assert_eq!(ByteSize::new(0), Err(SizeError::Zero));
        assert_eq!(ByteSize::new(4097), Err(SizeError::Unaligned(4097)));
    }

    #[test]
    fn human() {
        assert_eq!(HumanSize(1 << 30).to_string(), "1 GiB");
        assert_eq!(HumanSize(3 << 20).to_string(), "3 MiB");
        assert_eq!(HumanSize(12288).to_string(), "12 KiB");
        assert_eq!(HumanSize(100).to_string(), "100 B");
        assert_eq!(parse_size("256M").unwrap().to_string(), "256 MiB");
    }

    #[test]
    fn pages_and_mib() {
        let s = parse_size("2G").unwrap();
        assert_eq!(s.mib(), 2048);
        assert_eq!(s.pages(2 << 20), 1024);
        assert!(s.is_multiple_of(1 << 30));
        assert!(!parse_size("1536M").unwrap().is_multiple_of(1 << 30));
    }
}
