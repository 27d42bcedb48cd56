//! C enums and flag sets of `infiniband/verbs.h`, as transparent newtypes.
//!
//! Every constant's value is checked against the installed header by the
//! layout tests (`tests/layout.rs`), by its full C name (prefix + name).

c_enum! {
    /// `enum ibv_wc_status`: the outcome of a work request, written by the library.
    pub struct ibv_wc_status(u32), prefix "IBV_WC_" {
        SUCCESS = 0,
        LOC_LEN_ERR = 1,
        LOC_QP_OP_ERR = 2,
        LOC_EEC_OP_ERR = 3,
        LOC_PROT_ERR = 4,
        WR_FLUSH_ERR = 5,
        MW_BIND_ERR = 6,
        BAD_RESP_ERR = 7,
        LOC_ACCESS_ERR = 8,
        REM_INV_REQ_ERR = 9,
        REM_ACCESS_ERR = 10,
        REM_OP_ERR = 11,
        RETRY_EXC_ERR = 12,
        RNR_RETRY_EXC_ERR = 13,
        LOC_RDD_VIOL_ERR = 14,
        REM_INV_RD_REQ_ERR = 15,
        REM_ABORT_ERR = 16,
        INV_EECN_ERR = 17,
        INV_EEC_STATE_ERR = 18,
        FATAL_ERR = 19,
        RESP_TIMEOUT_ERR = 20,
        GENERAL_ERR = 21,
        TM_ERR = 22,
        TM_RNDV_INCOMPLETE = 23,
    }
}

c_enum! {
    /// `enum ibv_wc_opcode`: what a completion completed, written by the library.
    pub struct ibv_wc_opcode(u32), prefix "IBV_WC_" {
        SEND = 0,
        RDMA_WRITE = 1,
        RDMA_READ = 2,
        COMP_SWAP = 3,
        FETCH_ADD = 4,
        BIND_MW = 5,
        LOCAL_INV = 6,
        TSO = 7,
        ATOMIC_WRITE = 9,
        RECV = 128,
        RECV_RDMA_WITH_IMM = 129,
    }
}

c_flags! {
    /// `enum ibv_wc_flags` (the `wc_flags` field of `struct ibv_wc`).
    pub struct ibv_wc_flags(u32), prefix "IBV_WC_" {
        GRH = 1 << 0,
        WITH_IMM = 1 << 1,
        IP_CSUM_OK = 1 << 2,
        WITH_INV = 1 << 3,
    }
}

c_enum! {
    /// `enum ibv_wr_opcode`: the operation a send work request asks for.
    pub struct ibv_wr_opcode(u32), prefix "IBV_WR_" {
        RDMA_WRITE = 0,
        RDMA_WRITE_WITH_IMM = 1,
        SEND = 2,
        SEND_WITH_IMM = 3,
        RDMA_READ = 4,
        ATOMIC_CMP_AND_SWP = 5,
        ATOMIC_FETCH_AND_ADD = 6,
        LOCAL_INV = 7,
        BIND_MW = 8,
        SEND_WITH_INV = 9,
        TSO = 10,
        DRIVER1 = 11,
        ATOMIC_WRITE = 15,
    }
}

c_flags! {
    /// `enum ibv_send_flags`.
    pub struct ibv_send_flags(u32), prefix "IBV_SEND_" {
        FENCE = 1 << 0,
        SIGNALED = 1 << 1,
        SOLICITED = 1 << 2,
        INLINE = 1 << 3,
        IP_CSUM = 1 << 4,
    }
}

c_enum! {
    /// `enum ibv_qp_state`.
    pub struct ibv_qp_state(u32), prefix "IBV_QPS_" {
        RESET = 0,
        INIT = 1,
        RTR = 2,
        RTS = 3,
        SQD = 4,
        SQE = 5,
        ERR = 6,
        UNKNOWN = 7,
    }
}

c_enum! {
    /// `enum ibv_qp_type`.
    pub struct ibv_qp_type(u32), prefix "IBV_QPT_" {
        RC = 2,
        UC = 3,
        UD = 4,
        RAW_PACKET = 8,
        XRC_SEND = 9,
        XRC_RECV = 10,
        DRIVER = 0xff,
    }
}

c_enum! {
    /// `enum ibv_mtu`: path and port MTUs as the library encodes them.
    pub struct ibv_mtu(u32), prefix "IBV_" {
        MTU_256 = 1,
        MTU_512 = 2,
        MTU_1024 = 3,
        MTU_2048 = 4,
        MTU_4096 = 5,
    }
}

c_enum! {
    /// `enum ibv_port_state`.
    pub struct ibv_port_state(u32), prefix "IBV_PORT_" {
        NOP = 0,
        DOWN = 1,
        INIT = 2,
        ARMED = 3,
        ACTIVE = 4,
        ACTIVE_DEFER = 5,
    }
}

c_enum! {
    /// The anonymous `IBV_LINK_LAYER_*` enum (the `u8` `link_layer` field of
    /// `struct ibv_port_attr`).
    pub struct ibv_link_layer(u8), prefix "IBV_LINK_LAYER_" {
        UNSPECIFIED = 0,
        INFINIBAND = 1,
        ETHERNET = 2,
    }
}

c_enum! {
    /// `enum ibv_gid_type` (the `u32` `gid_type` field of `struct ibv_gid_entry`).
    pub struct ibv_gid_type(u32), prefix "IBV_GID_TYPE_" {
        IB = 0,
        ROCE_V1 = 1,
        ROCE_V2 = 2,
    }
}

c_enum! {
    /// `enum ibv_event_type`: asynchronous events.
    pub struct ibv_event_type(u32), prefix "IBV_EVENT_" {
        CQ_ERR = 0,
        QP_FATAL = 1,
        QP_REQ_ERR = 2,
        QP_ACCESS_ERR = 3,
        COMM_EST = 4,
        SQ_DRAINED = 5,
        PATH_MIG = 6,
        PATH_MIG_ERR = 7,
        DEVICE_FATAL = 8,
        PORT_ACTIVE = 9,
        PORT_ERR = 10,
        LID_CHANGE = 11,
        PKEY_CHANGE = 12,
        SM_CHANGE = 13,
        SRQ_ERR = 14,
        SRQ_LIMIT_REACHED = 15,
        QP_LAST_WQE_REACHED = 16,
        CLIENT_REREGISTER = 17,
        GID_CHANGE = 18,
        WQ_FATAL = 19,
    }
}

c_enum! {
    /// `enum ibv_atomic_cap`.
    pub struct ibv_atomic_cap(u32), prefix "IBV_ATOMIC_" {
        NONE = 0,
        HCA = 1,
        GLOB = 2,
    }
}

c_enum! {
    /// `enum ibv_mw_type`.
    pub struct ibv_mw_type(u32), prefix "IBV_MW_" {
        TYPE_1 = 1,
        TYPE_2 = 2,
    }
}

c_enum! {
    /// `enum ibv_mig_state`.
    pub struct ibv_mig_state(u32), prefix "IBV_MIG_" {
        MIGRATED = 0,
        REARM = 1,
        ARMED = 2,
    }
}

c_flags! {
    /// `enum ibv_qp_attr_mask`: which fields of `struct ibv_qp_attr` a call uses.
    pub struct ibv_qp_attr_mask(u32), prefix "IBV_QP_" {
        STATE = 1 << 0,
        CUR_STATE = 1 << 1,
        EN_SQD_ASYNC_NOTIFY = 1 << 2,
        ACCESS_FLAGS = 1 << 3,
        PKEY_INDEX = 1 << 4,
        PORT = 1 << 5,
        QKEY = 1 << 6,
        AV = 1 << 7,
        PATH_MTU = 1 << 8,
        TIMEOUT = 1 << 9,
        RETRY_CNT = 1 << 10,
        RNR_RETRY = 1 << 11,
        RQ_PSN = 1 << 12,
        MAX_QP_RD_ATOMIC = 1 << 13,
        ALT_PATH = 1 << 14,
        MIN_RNR_TIMER = 1 << 15,
        SQ_PSN = 1 << 16,
        MAX_DEST_RD_ATOMIC = 1 << 17,
        PATH_MIG_STATE = 1 << 18,
        CAP = 1 << 19,
        DEST_QPN = 1 << 20,
        RATE_LIMIT = 1 << 25,
    }
}

c_flags! {
    /// `enum ibv_srq_attr_mask`.
    pub struct ibv_srq_attr_mask(u32), prefix "IBV_SRQ_" {
        MAX_WR = 1 << 0,
        LIMIT = 1 << 1,
    }
}

c_flags! {
    /// `enum ibv_access_flags`: what a region, window or QP lets a peer do.
    pub struct ibv_access_flags(u32), prefix "IBV_ACCESS_" {
        LOCAL_WRITE = 1,
        REMOTE_WRITE = 1 << 1,
        REMOTE_READ = 1 << 2,
        REMOTE_ATOMIC = 1 << 3,
        MW_BIND = 1 << 4,
        ZERO_BASED = 1 << 5,
        ON_DEMAND = 1 << 6,
        HUGETLB = 1 << 7,
        RELAXED_ORDERING = 1 << 20,
    }
}
