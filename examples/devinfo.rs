//! Lists RDMA devices, their ports and GID tables, in the layout of
//! MOFED's `show_gids` (primer 4.2), plus the GID index verbs would pick.
//!
//! ```text
//! cargo run --example devinfo [-- --dev NAME]
//! ```
//! Exit status 1 when no device (or not the named one) is found.

use std::process::ExitCode;

use verbs::device::{choose_gid_index, GidType, PortAttr};
use verbs::{devices, Context, Error, Gid, GidEntry, Mtu};

const USAGE: &str = "usage: devinfo [--dev NAME]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let wanted = match args.as_slice() {
        [] => None,
        [flag, name] if flag == "--dev" => Some(name.as_str()),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let list = match devices() {
        Ok(list) => list,
        Err(e) => {
            eprintln!("devinfo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let list: Vec<_> = list
        .into_iter()
        .filter(|d| wanted.is_none_or(|w| d.name == w))
        .collect();
    if list.is_empty() {
        match wanted {
            Some(name) => {
                eprintln!("devinfo: no RDMA device named {name:?} (`ibv_devices` lists them)")
            }
            None => eprintln!(
                "devinfo: no RDMA devices found (a NIC with its driver, or Soft-RoCE: \
                 `rdma link add rxe0 type rxe netdev eth0`)"
            ),
        }
        return ExitCode::FAILURE;
    }
    let mut status = ExitCode::SUCCESS;
    for dev in &list {
        println!("{}  GUID {}", dev.name, guid_text(dev.guid));
        if let Err(e) = show_ports(&dev.name) {
            println!("  error: {e}");
            status = ExitCode::FAILURE;
        }
        println!();
    }
    status
}

fn show_ports(name: &str) -> Result<(), Error> {
    let ctx = Context::open(Some(name))?;
    let ports = ctx.query_device()?.phys_port_cnt();
    for port in 1..=ports {
        let attr = ctx.query_port(port)?;
        let table = ctx.gid_table(port)?;
        print_port(port, &attr, &table);
        print_gid_table(name, port, &table);
        match choose_gid_index(&table) {
            Some(i) => {
                let e = table
                    .iter()
                    .find(|e| e.index == i)
                    .expect("chosen from the table");
                println!("  auto GID index: {i} ({}, {})", e.gid, version(e.gid_type));
            }
            None => {
                println!("  auto GID index: none (no usable GID: give the netdev an IP address)")
            }
        }
    }
    Ok(())
}

fn print_port(port: u8, attr: &PortAttr, table: &[GidEntry]) {
    let populated = table.iter().filter(|e| !e.gid.is_zero()).count();
    println!(
        "  port {port}: state {}  link {}  MTU {} active / {} max  LID {}  GIDs {populated} of {}",
        attr.state(),
        attr.link_layer(),
        Mtu(attr.active_mtu().0),
        Mtu(attr.max_mtu().0),
        attr.lid(),
        attr.gid_tbl_len(),
    );
}

/// One row per populated GID, like `show_gids`: the full hex form, the
/// IPv4 address of a mapped GID, the version and the network device.
fn print_gid_table(dev: &str, port: u8, table: &[GidEntry]) {
    println!(
        "{:<8} {:<4} {:<5} {:<39} {:<15} {:<3} NETDEV",
        "DEV", "PORT", "INDEX", "GID", "IPv4", "VER"
    );
    for e in table.iter().filter(|e| !e.gid.is_zero()) {
        let ipv4 = e
            .gid
            .ipv4()
            .map(|[a, b, c, d]| format!("{a}.{b}.{c}.{d}"))
            .unwrap_or_default();
        println!(
            "{dev:<8} {port:<4} {:<5} {:<39} {ipv4:<15} {:<3} {}",
            e.index,
            full_hex(&e.gid),
            version(e.gid_type),
            e.netdev().unwrap_or_default(),
        );
    }
}

/// The GID as `show_gids` prints it: eight 4-digit groups, no compression,
/// so the columns line up.
fn full_hex(gid: &Gid) -> String {
    hex_groups(gid.as_bytes())
}

/// Bytes as colon-separated 4-digit hex groups.
fn hex_groups(bytes: &[u8]) -> String {
    let groups: Vec<String> = bytes
        .chunks(2)
        .map(|g| format!("{:02x}{:02x}", g[0], g[1]))
        .collect();
    groups.join(":")
}

fn version(t: GidType) -> String {
    match t {
        GidType::ROCE_V1 => "v1".into(),
        GidType::ROCE_V2 => "v2".into(),
        GidType::IB => "IB".into(),
        other => other.to_string(),
    }
}

/// `ibv_devinfo`'s node GUID form: `xxxx:xxxx:xxxx:xxxx`.
fn guid_text(guid: u64) -> String {
    hex_groups(&guid.to_be_bytes())
}
