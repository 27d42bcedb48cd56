//! A port's GID table, and the choice of the entry to use (primer 4.2,
//! 6.1: RoCE v2, IPv4-mapped, never link-local while a routable one exists).

use alloc::string::String;

use crate::error::{site, Error, ErrorKind};
use crate::gid::Gid;

pub use crate::sys::ibv_gid_type as GidType;

/// One valid entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID index (what `sgid_index` takes).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// IB, RoCE v1 or RoCE v2.
    pub gid_type: GidType,
    /// The network device's interface index (0 on InfiniBand).
    pub ifindex: u32,
}

impl GidEntry {
    /// The network device's name (e.g. `eth0`), when the library reports one.
    pub fn netdev(&self) -> Option<String> {
        if self.ifindex == 0 {
            return None;
        }
        crate::raw::os::if_name(self.ifindex)
    }
}

/// Picks the GID index to use when the caller did not name one: RoCE v2
/// before v1 (and IB), IPv4-mapped before IPv6, never link-local while a
/// routable GID exists, never a zero GID. `None` when the table has no
/// usable entry.
pub fn choose_gid_index(table: &[GidEntry]) -> Option<u32> {
    choose_gid(table).map(|e| e.index)
}

/// The entry [`choose_gid_index`] picks (its address, type and netdev).
pub fn choose_gid(table: &[GidEntry]) -> Option<&GidEntry> {
    table.iter().filter(|e| !e.gid.is_zero()).max_by_key(|e| {
        let v2 = u32::from(e.gid_type == GidType::ROCE_V2);
        let ipv4 = u32::from(e.gid.ipv4().is_some());
        let routable = u32::from(!e.gid.is_link_local());
        // Routable first, then RoCE v2, then IPv4; lowest index breaks ties.
        (routable * 4 + v2 * 2 + ipv4, core::cmp::Reverse(e.index))
    })
}

/// Checks an explicitly requested GID index against the table.
pub fn validate_gid_index(
    table: &[GidEntry],
    index: u32,
    table_len: u32,
) -> Result<GidEntry, Error> {
    if index >= table_len {
        return Err(Error::new(
            site!(
                "GID index",
                "GID index past the port's GID table",
                "`ibv_devinfo -v` or `show_gids` lists the valid indexes; omit the index to choose automatically"
            ),
            ErrorKind::NotFound,
        ));
    }
    match table.iter().find(|e| e.index == index) {
        Some(e) if !e.gid.is_zero() => Ok(*e),
        _ => Err(Error::new(
            site!(
                "GID index",
                "the GID table entry at that index is empty",
                "omit the index to choose automatically (RoCE v2, IPv4-mapped first)"
            ),
            ErrorKind::NotFound,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, gid: Gid, gid_type: GidType) -> GidEntry {
        GidEntry {
            index,
            gid,
            gid_type,
            ifindex: 0,
        }
    }

    fn link_local() -> Gid {
        let mut raw = [0u8; 16];
        raw[0] = 0xfe;
        raw[1] = 0x80;
        raw[15] = 1;
        Gid::from_raw(raw)
    }

    #[test]
    fn rxe_table_picks_the_ipv4_mapped_v2_entry() {
        let table = [
            entry(0, link_local(), GidType::ROCE_V2),
            entry(1, Gid::from_ipv4([10, 0, 0, 1]), GidType::ROCE_V2),
        ];
        assert_eq!(choose_gid_index(&table), Some(1));
    }

    #[test]
    fn mlx_style_table_picks_index_3() {
        let table = [
            entry(0, link_local(), GidType::ROCE_V1),
            entry(1, link_local(), GidType::ROCE_V2),
            entry(2, Gid::from_ipv4([10, 0, 0, 1]), GidType::ROCE_V1),
            entry(3, Gid::from_ipv4([10, 0, 0, 1]), GidType::ROCE_V2),
        ];
        assert_eq!(choose_gid_index(&table), Some(3));
    }

    #[test]
    fn link_local_only_when_nothing_else_and_never_zero() {
        let table = [
            entry(0, Gid::ZERO, GidType::ROCE_V2),
            entry(1, link_local(), GidType::IB),
        ];
        assert_eq!(choose_gid_index(&table), Some(1));
        assert_eq!(
            choose_gid_index(&[entry(0, Gid::ZERO, GidType::ROCE_V2)]),
            None
        );
    }

    #[test]
    fn explicit_index_is_validated() {
        let table = [entry(0, link_local(), GidType::ROCE_V2)];
        assert!(validate_gid_index(&table, 0, 16).is_ok());
        assert_eq!(
            validate_gid_index(&table, 16, 16).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            validate_gid_index(&table, 5, 16).unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }
}
