//! Byte quantities in Kubernetes notation (`512Mi`, `1G`, `1.5Gi`,
//! `1048576`), read as exact byte counts so that limits can be added and
//! compared: a sandbox's ephemeral-storage limit is the sum of what its
//! volumes and writable layer may use, and the session policy caps what a
//! session may ask for.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The largest byte count read: 8 EiB, far above any disk, and small
/// enough that sums of a few never overflow.
const MAX_BYTES: u128 = 8 << 60;

/// The byte count `q` stands for, rounded up to a whole byte; `None` for
/// what is not a non-negative byte quantity (a CPU quantity like `500m` of
/// bytes is refused: a thousandth of a byte is no bound).
pub fn bytes(q: &str) -> Option<u128> {
    const SUFFIXES: [(&str, u128); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    let q = q.trim();
    if q.len() > 40 {
        return None;
    }
    let (number, unit) = SUFFIXES
        .iter()
        .find_map(|(s, u)| q.strip_suffix(s).map(|n| (n, *u)))
        .unwrap_or((q, 1));
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut total = whole.checked_mul(unit)?;
    if !frac.is_empty() {
        let digits = u32::try_from(frac.len()).ok().filter(|d| *d <= 18)?;
        let scale = 10u128.pow(digits);
        let f: u128 = frac.parse().ok()?;
        total = total.checked_add((f * unit).div_ceil(scale))?;
    }
    (total <= MAX_BYTES).then_some(total)
}

/// Any quantity (`500m`, `2`, `1.5Gi`) in thousandths, for comparing two
/// quantities of one resource; `None` for what is not one.
pub fn millis(q: &str) -> Option<u128> {
    let q = q.trim();
    match q.strip_suffix('m') {
        Some(n) if !n.ends_with(['E', 'P', 'T', 'G', 'M', 'k']) => {
            // `n` is then a plain number of thousandths.
            bytes(n)
        }
        _ => bytes(q)?.checked_mul(1000),
    }
}

/// [`bytes`] of a Kubernetes quantity.
pub fn of(q: &Quantity) -> Option<u128> {
    bytes(&q.0)
}

/// `n` bytes as a quantity: in `Mi` when whole, else in bytes.
pub fn from_bytes(n: u128) -> Quantity {
    const MI: u128 = 1 << 20;
    if n > 0 && n.is_multiple_of(MI) {
        Quantity(format!("{}Mi", n / MI))
    } else {
        Quantity(n.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_quantities_read_exactly() {
        assert_eq!(bytes("512Mi"), Some(512 << 20));
        assert_eq!(bytes("1Gi"), Some(1 << 30));
        assert_eq!(bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(bytes("2G"), Some(2_000_000_000));
        assert_eq!(bytes("1048576"), Some(1 << 20));
        assert_eq!(bytes("0.5"), Some(1), "rounded up to a whole byte");
        assert_eq!(bytes(".5Ki"), Some(512));
    }

    #[test]
    fn what_is_not_a_byte_quantity_is_refused() {
        for bad in [
            "", "Mi", "-1Gi", "1e3", "500m", "1 Gi", "1Gb", "1..2", "9Ei", "x", "1.5.5Gi",
        ] {
            assert_eq!(bytes(bad), None, "{bad:?}");
        }
        assert_eq!(bytes(&"9".repeat(100)), None);
    }

    #[test]
    fn any_quantity_compares_in_thousandths() {
        assert_eq!(millis("500m"), Some(500));
        assert_eq!(millis("2"), Some(2000));
        assert_eq!(millis("1Ki"), Some(1024 * 1000));
        assert!(millis("1Gi") > millis("1G"));
        assert_eq!(millis("m"), None);
    }

    #[test]
    fn whole_mebibytes_print_as_mi() {
        assert_eq!(from_bytes(6 << 30).0, "6144Mi");
        assert_eq!(from_bytes(1000).0, "1000");
        assert_eq!(bytes(&from_bytes(12345 << 20).0), Some(12345 << 20));
    }
}
