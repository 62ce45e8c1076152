//! IP ranges in CIDR notation: what the platform lists for sandbox egress
//! and for the operator's own MCP connections, parsed once at start-up
//! (a malformed range fails the start, naming it).

use std::net::IpAddr;

/// An IP range in CIDR notation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a CIDR (e.g. 10.0.0.0/8, 2001:db8::/32)");
        let (addr, prefix) = s.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(bad());
        }
        let cidr = Cidr { addr, prefix };
        if cidr.network() != addr {
            return Err(format!(
                "{s:?} has host bits set; the network is {}/{prefix}",
                cidr.network()
            ));
        }
        Ok(cidr)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Cidr {
    fn bits(addr: IpAddr) -> (u128, u8) {
        match addr {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        }
    }

    fn mask(&self) -> u128 {
        let (_, width) = Self::bits(self.addr);
        if self.prefix == 0 {
            return 0;
        }
        let ones = u128::MAX << (128 - u32::from(self.prefix));
        ones >> (128 - u32::from(width))
    }

    fn network(&self) -> IpAddr {
        let (bits, _) = Self::bits(self.addr);
        let net = bits & self.mask();
        match self.addr {
            IpAddr::V4(_) => IpAddr::V4(u32::try_from(net).unwrap_or(0).into()),
            IpAddr::V6(_) => IpAddr::V6(net.into()),
        }
    }

    /// Whether `ip` lies within this range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        if self.addr.is_ipv4() != ip.is_ipv4() {
            return false;
        }
        let (a, _) = Self::bits(self.addr);
        let (b, _) = Self::bits(ip);
        a & self.mask() == b & self.mask()
    }

    /// Whether `inner` lies within this range and is strictly smaller (a
    /// NetworkPolicy `except` must be).
    pub fn strictly_contains(&self, inner: &Cidr) -> bool {
        inner.prefix > self.prefix && self.contains(inner.addr)
    }
}
