//! The guest -> host protocol, both ends in one place: compiled into the host xtask and into
//! the guest's init (`src/bin/dmaprof-vm-init.rs`), so it uses nothing but `std`.
//!
//! ttyS0 (the console) carries kernel messages, the payload's output and [`EXIT_MARKER`] with the
//! payload's exit status. ttyS1 (the data port, a file on the host) carries the payload's output
//! directory: a .tar.gz as base64 lines between [`XFER_BEGIN`] and [`XFER_END`], the end line
//! holding its sha256 and size, so a truncated or corrupted transfer is detected.
#![allow(dead_code, reason = "the host decodes, the guest encodes: each uses half")]

/// Console line the guest prints with the payload's exit status, after its output was shipped.
pub const EXIT_MARKER: &str = "DMAPROF-VM-EXIT ";
/// First data-port line of a transfer.
pub const XFER_BEGIN: &str = "DMAPROF-XFER-BEGIN";
/// Last data-port line of a transfer: `DMAPROF-XFER-END <sha256 hex> <size>`.
pub const XFER_END: &str = "DMAPROF-XFER-END ";

/// The data-port text for `archive`.
pub fn encode(archive: &[u8]) -> String {
    let b64 = base64_encode(archive);
    let mut out = String::with_capacity(b64.len() + b64.len() / 76 + 128);
    out.push_str(XFER_BEGIN);
    out.push('\n');
    for chunk in b64.as_bytes().chunks(76) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("{XFER_END}{} {}\n", sha256_hex(archive), archive.len()));
    out
}

/// The archive in the data-port text: `Ok(None)` if the guest shipped nothing, an error if what
/// it shipped did not arrive whole.
pub fn decode(text: &str) -> Result<Option<Vec<u8>>, String> {
    let mut lines = text.lines().map(|l| l.trim_matches(['\r', ' ']));
    if !lines.by_ref().any(|l| l == XFER_BEGIN) {
        return Ok(None);
    }
    let mut b64 = String::new();
    let mut end = None;
    for l in lines {
        if let Some(rest) = l.strip_prefix(XFER_END.trim_end()) {
            end = Some(rest.trim().to_owned());
            break;
        }
        b64 += l;
    }
    let end = end.ok_or("guest output transfer incomplete: no end marker on the data port")?;
    let mut words = end.split_whitespace();
    let (sha, size) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let data = base64_decode(&b64).ok_or("guest output transfer corrupt: bad base64")?;
    let got = sha256_hex(&data);
    if got != sha || data.len().to_string() != size {
        return Err(format!(
            "guest output transfer corrupt: got {} bytes sha256 {got}, guest sent {size} bytes sha256 {sha}",
            data.len()
        ));
    }
    Ok(Some(data))
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let t = text.as_bytes();
    if !t.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(t.len() / 4 * 3);
    for (ci, chunk) in t.chunks(4).enumerate() {
        let last = ci == t.len() / 4 - 1;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = n << 6 | B64.iter().position(|&x| x == c)? as u32;
        }
        n <<= 6 * pad as u32;
        out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8][..3 - pad]);
    }
    Some(out)
}

/// SHA-256 of `data` as lowercase hex (FIPS 180-4).
pub fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
        0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
        0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
        0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
        0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
        0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
        0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            (hh, g, f, e, d, c, b, a) = (g, f, e, d.wrapping_add(t1), c, b, a, t1.wrapping_add(t2));
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_known_answers() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn base64_round_trip_and_known_answers() {
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(b"fooba"), "Zm9vYmE=");
        assert_eq!(base64_encode(b"foob"), "Zm9vYg==");
        for n in 0..70u8 {
            let data: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
            assert_eq!(base64_decode(&base64_encode(&data)), Some(data));
        }
        for bad in ["Zm9", "Zm=v", "Zm9v!A==", "Z==="] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }

    fn sample() -> Vec<u8> {
        (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect()
    }

    #[test]
    fn round_trip_among_console_noise() {
        let data = sample();
        let text = format!("[    1.0] noise before\r\n{}", encode(&data)).replace('\n', "\r\n");
        assert_eq!(decode(&text), Ok(Some(data)));
        assert_eq!(decode("just kernel messages\n"), Ok(None));
        assert_eq!(decode(&encode(b"")), Ok(Some(Vec::new())));
    }

    #[test]
    fn truncated_or_corrupted_is_detected() {
        let text = encode(&sample());
        // Cut before the end marker.
        let cut = &text[..text.len() / 2];
        assert!(decode(cut).unwrap_err().contains("incomplete"), "truncated");
        // A base64 line lost: sizes and sha disagree (or the base64 breaks).
        let mut lines: Vec<&str> = text.lines().collect();
        lines.remove(3);
        assert!(decode(&lines.join("\n")).unwrap_err().contains("corrupt"), "line lost");
        // One character flipped inside the data.
        let mut flipped: Vec<String> = text.lines().map(str::to_owned).collect();
        let c = if flipped[1].starts_with('A') { "B" } else { "A" };
        flipped[1].replace_range(0..1, c);
        assert!(decode(&flipped.join("\n")).unwrap_err().contains("corrupt"), "bit flip");
        // The end line's size is wrong.
        let end = text.lines().last().unwrap().to_owned();
        let bad_end = text.replace(&end, &format!("{} 1", &end[..end.rfind(' ').unwrap()]));
        assert!(decode(&bad_end).unwrap_err().contains("corrupt"), "size");
    }
}
