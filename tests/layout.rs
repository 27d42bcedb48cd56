//! Every mirrored struct, field and constant of `verbs::sys`, checked
//! against the installed `infiniband/verbs.h` (no RDMA device needed).
//!
//! `tests/probe/verbs_probe.c` is compiled with the compiler and flags the
//! build script used; it prints what C thinks. This test compares that with
//! what Rust thinks, and fails naming the struct and field that drifted.

use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};
use std::process::Command;

use verbs::sys::*;

/// The size of the type a field-projection closure points at. The closure
/// is never called: it only names the field's type.
fn pointee_size<T, F>(_project: fn(*const T) -> *const F) -> usize {
    size_of::<F>()
}

struct Mirror {
    name: &'static str,
    size: usize,
    align: usize,
    /// (C field path, offset, size)
    fields: Vec<(String, usize, usize)>,
}

macro_rules! mirror {
    ($t:ident { $( $($seg:ident).+ $(=> $c:literal)? ),* $(,)? }) => {
        Mirror {
            name: stringify!($t),
            size: size_of::<$t>(),
            align: align_of::<$t>(),
            fields: vec![$(
                (
                    c_name(stringify!($($seg).+), &[$($c)?]),
                    offset_of!($t, $($seg).+),
                    // SAFETY: the closure is never called; `addr_of!` only
                    // names the field so its type can be inferred.
                    pointee_size(|p: *const $t| unsafe { std::ptr::addr_of!((*p).$($seg).+) }),
                ),
            )*],
        }
    };
}

fn c_name(rust_path: &str, explicit: &[&str]) -> String {
    explicit
        .first()
        .map(|s| s.to_string())
        .unwrap_or_else(|| rust_path.replace(' ', ""))
}

fn mirrors() -> Vec<Mirror> {
    #[allow(unused_mut)]
    let mut all = vec![
        mirror!(ibv_gid { raw }),
        mirror!(ibv_device_attr {
            fw_ver,
            node_guid,
            sys_image_guid,
            max_mr_size,
            page_size_cap,
            vendor_id,
            vendor_part_id,
            hw_ver,
            max_qp,
            max_qp_wr,
            device_cap_flags,
            max_sge,
            max_sge_rd,
            max_cq,
            max_cqe,
            max_mr,
            max_pd,
            max_qp_rd_atom,
            max_ee_rd_atom,
            max_res_rd_atom,
            max_qp_init_rd_atom,
            max_ee_init_rd_atom,
            atomic_cap,
            max_ee,
            max_rdd,
            max_mw,
            max_raw_ipv6_qp,
            max_raw_ethy_qp,
            max_mcast_grp,
            max_mcast_qp_attach,
            max_total_mcast_qp_attach,
            max_ah,
            max_fmr,
            max_map_per_fmr,
            max_srq,
            max_srq_wr,
            max_srq_sge,
            max_pkeys,
            local_ca_ack_delay,
            phys_port_cnt,
        }),
        mirror!(ibv_port_attr {
            state,
            max_mtu,
            active_mtu,
            gid_tbl_len,
            port_cap_flags,
            max_msg_sz,
            bad_pkey_cntr,
            qkey_viol_cntr,
            pkey_tbl_len,
            lid,
            sm_lid,
            lmc,
            max_vl_num,
            sm_sl,
            subnet_timeout,
            init_type_reply,
            active_width,
            active_speed,
            phys_state,
            link_layer,
            flags,
            port_cap_flags2,
        }),
        mirror!(ibv_gid_entry {
            gid,
            gid_index,
            port_num,
            gid_type,
            ndev_ifindex
        }),
        mirror!(ibv_global_route {
            dgid,
            flow_label,
            sgid_index,
            hop_limit,
            traffic_class
        }),
        mirror!(ibv_ah_attr {
            grh,
            dlid,
            sl,
            src_path_bits,
            static_rate,
            is_global,
            port_num
        }),
        mirror!(ibv_qp_cap {
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge,
            max_inline_data
        }),
        mirror!(ibv_qp_init_attr {
            qp_context,
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type,
            sq_sig_all
        }),
        mirror!(ibv_qp_attr {
            qp_state,
            cur_qp_state,
            path_mtu,
            path_mig_state,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            cap,
            ah_attr,
            alt_ah_attr,
            pkey_index,
            alt_pkey_index,
            en_sqd_async_notify,
            sq_draining,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry,
            alt_port_num,
            alt_timeout,
            rate_limit,
        }),
        mirror!(ibv_sge { addr, length, lkey }),
        mirror!(ibv_send_wr {
            wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data,
            imm_data => "invalidate_rkey",
            wr, wr.rdma.remote_addr, wr.rdma.rkey,
            wr.atomic.remote_addr, wr.atomic.compare_add, wr.atomic.swap, wr.atomic.rkey,
            wr.ud.ah, wr.ud.remote_qpn, wr.ud.remote_qkey,
            qp_type, qp_type.xrc_remote_srqn => "qp_type.xrc.remote_srqn",
            bind_mw_or_tso.bind_mw => "bind_mw",
            bind_mw_or_tso.bind_mw.mw => "bind_mw.mw",
            bind_mw_or_tso.bind_mw.rkey => "bind_mw.rkey",
            bind_mw_or_tso.bind_mw.bind_info => "bind_mw.bind_info",
            bind_mw_or_tso.tso => "tso",
            bind_mw_or_tso.tso.hdr => "tso.hdr",
            bind_mw_or_tso.tso.hdr_sz => "tso.hdr_sz",
            bind_mw_or_tso.tso.mss => "tso.mss",
        }),
        mirror!(ibv_recv_wr {
            wr_id,
            next,
            sg_list,
            num_sge
        }),
        mirror!(ibv_wc {
            wr_id, status, opcode, vendor_err, byte_len, imm_data, imm_data => "invalidated_rkey",
            qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits,
        }),
        mirror!(ibv_mw_bind_info {
            mr,
            addr,
            length,
            mw_access_flags
        }),
        mirror!(ibv_mw_bind {
            wr_id,
            send_flags,
            bind_info
        }),
        mirror!(ibv_async_event {
            element, element.cq, element.qp, element.srq, element.wq, element.port_num, event_type,
        }),
        mirror!(ibv_srq_attr {
            max_wr,
            max_sge,
            srq_limit
        }),
        mirror!(ibv_srq_init_attr { srq_context, attr }),
        mirror!(ibv_pd { context, handle }),
        mirror!(ibv_mr {
            context,
            pd,
            addr,
            length,
            handle,
            lkey,
            rkey
        }),
        mirror!(ibv_mw { context, pd, rkey, handle, type_ => "type" }),
        mirror!(ibv_comp_channel {
            context,
            fd,
            refcnt
        }),
        mirror!(ibv_cq {
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed,
        }),
        mirror!(ibv_qp {
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle,
            qp_num,
            state,
            qp_type,
            mutex,
            cond,
            events_completed,
        }),
        mirror!(ibv_srq {
            context,
            srq_context,
            pd,
            handle,
            mutex,
            cond,
            events_completed
        }),
    ];
    #[cfg(feature = "rdmacm")]
    {
        use verbs::sys::rdmacm::*;
        all.extend([
            mirror!(rdma_event_channel { fd }),
            mirror!(rdma_conn_param {
                private_data,
                private_data_len,
                responder_resources,
                initiator_depth,
                flow_control,
                retry_count,
                rnr_retry_count,
                srq,
                qp_num,
            }),
            mirror!(rdma_ud_param {
                private_data,
                private_data_len,
                ah_attr,
                qp_num,
                qkey
            }),
            mirror!(rdma_cm_event { id, listen_id, event, status, param, param.conn, param.ud }),
        ]);
    }
    all
}

/// (C name, value) of every constant of every mirrored enum and flag set.
fn rust_constants() -> Vec<(String, i64)> {
    let mut out = Vec::new();
    macro_rules! consts {
        ($($t:ty),*) => {$(
            for (name, v) in <$t>::NAMED {
                out.push((format!("{}{}", <$t>::C_PREFIX, name), v.0 as i64));
            }
        )*};
    }
    consts!(
        ibv_wc_status,
        ibv_wc_opcode,
        ibv_wc_flags,
        ibv_wr_opcode,
        ibv_send_flags,
        ibv_qp_state,
        ibv_qp_type,
        ibv_mtu,
        ibv_port_state,
        ibv_link_layer,
        ibv_gid_type,
        ibv_event_type,
        ibv_atomic_cap,
        ibv_mw_type,
        ibv_mig_state,
        ibv_qp_attr_mask,
        ibv_srq_attr_mask,
        ibv_access_flags
    );
    #[cfg(feature = "rdmacm")]
    {
        use verbs::sys::rdmacm::*;
        consts!(rdma_cm_event_type, rdma_port_space);
    }
    out
}

struct Probe {
    types: BTreeMap<String, (usize, usize)>,
    fields: BTreeMap<(String, String), (usize, usize)>,
    consts: BTreeMap<String, i64>,
}

/// The probe's report, compiled and run once for all tests of this file.
fn run_probe() -> &'static Probe {
    static PROBE: std::sync::OnceLock<Probe> = std::sync::OnceLock::new();
    PROBE.get_or_init(compile_and_run_probe)
}

fn compile_and_run_probe() -> Probe {
    let mut probe = Probe {
        types: BTreeMap::new(),
        fields: BTreeMap::new(),
        consts: BTreeMap::new(),
    };
    run_one_probe("verbs_probe", &mut probe);
    if cfg!(feature = "rdmacm") {
        run_one_probe("rdmacm_probe", &mut probe);
    }
    probe
}

/// Compiles `tests/probe/NAME.c` and adds what it prints to `p`.
fn run_one_probe(name: &str, p: &mut Probe) {
    let dir = std::env::temp_dir().join(format!("verbs-layout-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(name);
    let src = format!("{}/tests/probe/{name}.c", env!("CARGO_MANIFEST_DIR"));
    let cc = env!("VERBS_BUILD_CC");
    let status = Command::new(cc)
        .args(env!("VERBS_BUILD_CFLAGS").split_whitespace())
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run C compiler {cc}: {e}"));
    assert!(status.success(), "the layout probe {name} did not compile");
    let out = Command::new(&exe).output().expect("run the layout probe");
    assert!(out.status.success());
    let _ = std::fs::remove_file(&exe);

    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w[0] {
            "type" => {
                p.types
                    .insert(w[1].into(), (w[2].parse().unwrap(), w[3].parse().unwrap()));
            }
            "field" => {
                p.fields.insert(
                    (w[1].into(), w[2].into()),
                    (w[3].parse().unwrap(), w[4].parse().unwrap()),
                );
            }
            "const" => {
                p.consts.insert(w[1].into(), w[2].parse().unwrap());
            }
            other => panic!("unexpected probe line kind {other}"),
        }
    }
}

#[test]
fn structs_match_verbs_h() {
    let probe = run_probe();
    let mut errors = Vec::new();
    let mut covered = std::collections::BTreeSet::new();
    for m in mirrors() {
        match probe.types.get(m.name) {
            None => errors.push(format!("{}: not reported by the probe", m.name)),
            Some(&(size, align)) => {
                if (size, align) != (m.size, m.align) {
                    errors.push(format!(
                        "{}: Rust size {} align {}, C size {size} align {align}",
                        m.name, m.size, m.align
                    ));
                }
            }
        }
        for (field, off, size) in &m.fields {
            let key = (m.name.to_string(), field.clone());
            match probe.fields.get(&key) {
                None => errors.push(format!("{}.{field}: no such field in the C probe", m.name)),
                Some(&(c_off, c_size)) => {
                    if (c_off, c_size) != (*off, *size) {
                        errors.push(format!(
                            "{}.{field}: Rust offset {off} size {size}, C offset {c_off} size {c_size}",
                            m.name
                        ));
                    }
                }
            }
            covered.insert(key);
        }
    }
    for (t, f) in probe.fields.keys() {
        if !covered.contains(&(t.clone(), f.clone())) {
            errors.push(format!(
                "{t}.{f}: in verbs.h but not mirrored in verbs::sys"
            ));
        }
    }
    for t in probe.types.keys() {
        if !mirrors().iter().any(|m| m.name == t) {
            errors.push(format!("{t}: probed but not mirrored"));
        }
    }
    assert!(
        errors.is_empty(),
        "layout drift against verbs.h:\n  {}",
        errors.join("\n  ")
    );
}

#[test]
fn constants_match_verbs_h() {
    let probe = run_probe();
    let rust = rust_constants();
    let mut errors = Vec::new();
    for (name, value) in &rust {
        match probe.consts.get(name) {
            None => errors.push(format!("{name}: mirrored in Rust but not probed")),
            Some(c) if c != value => errors.push(format!("{name}: Rust {value}, C {c}")),
            Some(_) => {}
        }
    }
    for name in probe.consts.keys() {
        if !rust.iter().any(|(n, _)| n == name) {
            errors.push(format!(
                "{name}: in verbs.h (probed) but not mirrored in verbs::sys"
            ));
        }
    }
    assert!(
        errors.is_empty(),
        "constant drift against verbs.h:\n  {}",
        errors.join("\n  ")
    );
}

#[test]
fn opaque_handles_are_zero_sized_and_unconstructible_from_safe_code() {
    // The crate only ever holds pointers to these.
    assert_eq!(size_of::<ibv_device>(), 0);
    assert_eq!(size_of::<ibv_context>(), 0);
}
