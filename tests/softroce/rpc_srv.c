/*
 * A request/response server's loop in C against libibverbs, the baseline
 * of examples/rpc_srv.rs (critpath's rpc_srv window): one RC queue pair
 * on a shared receive queue, one CQ for both. Per request: the SRQ
 * receive's completion, the reply (the request's 8-byte id copied into a
 * reply buffer, posted with ibv_post_send, every REPLY_SIGNAL-th one
 * signaled), the receive's buffer posted again with ibv_post_srq_recv.
 * The client role (never traced) sends N requests one at a time and
 * waits for each reply; it drives both servers.
 *
 *   rpc_srv_c server -p PORT -n N
 *   rpc_srv_c client ADDR -p PORT -n N
 *
 * Build: cc -O2 -o rpc_srv_c rpc_srv.c -libverbs
 * The endpoint exchange is 28 bytes each way over TCP (QPN, PSN, MTU
 * code, GID), the server answering once its queue pair is ready; its
 * receives are posted before it listens.
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MSG 32
#define SRQ_DEPTH 16
#define SEND_DEPTH 64
#define REPLY_SIGNAL 32
#define CQ_DEPTH (SRQ_DEPTH + SEND_DEPTH)

static void die(const char *what)
{
	perror(what);
	exit(1);
}

struct wire {
	uint32_t qpn, psn, mtu;
	uint8_t gid[16];
};

static int ipv4_mapped_gid(struct ibv_context *ctx, int len, union ibv_gid *gid)
{
	static const unsigned char prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	for (int i = 0; i < len; i++)
		if (ibv_query_gid(ctx, 1, i, gid) == 0 && memcmp(gid->raw, prefix, 12) == 0)
			return i;
	fprintf(stderr, "rpc_srv_c: no IPv4-mapped GID on port 1\n");
	exit(1);
}

static void full(int fd, void *buf, size_t len, int out)
{
	for (size_t at = 0; at < len;) {
		ssize_t n = out ? write(fd, (char *)buf + at, len - at) : read(fd, (char *)buf + at, len - at);
		if (n <= 0)
			die(out ? "write" : "read");
		at += n;
	}
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *mem;
	struct ibv_port_attr port;
	union ibv_gid gid;
	int gid_index;
};

static void open_side(struct side *s, int server, size_t bytes)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0)
		die("ibv_get_device_list");
	s->ctx = ibv_open_device(list[0]);
	if (!s->ctx)
		die("ibv_open_device");
	if (ibv_query_port(s->ctx, 1, &s->port))
		die("ibv_query_port");
	s->gid_index = ipv4_mapped_gid(s->ctx, s->port.gid_tbl_len, &s->gid);
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, CQ_DEPTH, NULL, NULL, 0);
	if (!s->pd || !s->cq)
		die("ibv_alloc_pd/ibv_create_cq");
	s->srq = NULL;
	if (server) {
		struct ibv_srq_init_attr sa = {.attr = {.max_wr = SRQ_DEPTH, .max_sge = 1}};
		s->srq = ibv_create_srq(s->pd, &sa);
		if (!s->srq)
			die("ibv_create_srq");
	}
	struct ibv_qp_init_attr init = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.srq = s->srq,
		.qp_type = IBV_QPT_RC,
		.cap = {SEND_DEPTH, server ? 0 : SRQ_DEPTH, 1, 1, 0},
	};
	s->qp = ibv_create_qp(s->pd, &init);
	if (!s->qp)
		die("ibv_create_qp");
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("ibv_modify_qp INIT");
	s->mem = aligned_alloc(4096, bytes);
	s->mr = s->mem ? ibv_reg_mr(s->pd, s->mem, bytes, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!s->mr)
		die("ibv_reg_mr");
}

static struct wire ours(const struct side *s)
{
	struct wire w = {.qpn = s->qp->qp_num, .psn = 0, .mtu = s->port.active_mtu};
	memcpy(w.gid, s->gid.raw, 16);
	return w;
}

static void connect_qp(const struct side *s, const struct wire *peer)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = peer->mtu < s->port.active_mtu ? peer->mtu : s->port.active_mtu,
		.dest_qp_num = peer->qpn,
		.rq_psn = peer->psn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = {
			.is_global = 1,
			.port_num = 1,
			.grh = {.sgid_index = s->gid_index, .hop_limit = 64},
		},
	};
	memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("ibv_modify_qp RTR");
	struct ibv_qp_attr b = {
		.qp_state = IBV_QPS_RTS,
		.sq_psn = 0,
		.timeout = 14,
		.retry_cnt = 7,
		.rnr_retry = 7,
		.max_rd_atomic = 1,
	};
	if (ibv_modify_qp(s->qp, &b, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		die("ibv_modify_qp RTS");
}

static void post_srq_recv(struct side *s, uint64_t slot)
{
	struct ibv_sge sge = {(uintptr_t)(s->mem + slot * MSG), MSG, s->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad;
	if (ibv_post_srq_recv(s->srq, &wr, &bad))
		die("ibv_post_srq_recv");
}

/* The loop: receives' buffers are slots 0..SRQ_DEPTH-1 (wr_id = slot),
 * replies' a ring of SEND_DEPTH after them. */
static void serve(struct side *s, uint64_t n)
{
	struct ibv_wc wc[16];
	uint64_t replies = 0;
	char *reply_mem = s->mem + SRQ_DEPTH * MSG;
	while (replies < n) {
		int got = ibv_poll_cq(s->cq, 16, wc);
		if (got < 0)
			die("ibv_poll_cq");
		for (int i = 0; i < got; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "rpc_srv_c: %s\n", ibv_wc_status_str(wc[i].status));
				exit(1);
			}
			if (!(wc[i].opcode & IBV_WC_RECV))
				continue; /* a signaled reply: its ring slot was free already */
			uint64_t slot = wc[i].wr_id;
			char *reply = reply_mem + (replies % SEND_DEPTH) * MSG;
			memcpy(reply, s->mem + slot * MSG, 8);
			struct ibv_sge sge = {(uintptr_t)reply, MSG, s->mr->lkey};
			struct ibv_send_wr wr = {
				.wr_id = replies,
				.sg_list = &sge,
				.num_sge = 1,
				.opcode = IBV_WR_SEND,
				.send_flags = (replies + 1) % REPLY_SIGNAL ? 0 : IBV_SEND_SIGNALED,
			}, *bad;
			if (ibv_post_send(s->qp, &wr, &bad))
				die("ibv_post_send");
			replies++;
			post_srq_recv(s, slot);
		}
	}
}

static void run_client(struct side *s, uint64_t n)
{
	struct ibv_wc wc[16];
	char *out = s->mem + SRQ_DEPTH * MSG;
	for (uint64_t slot = 0; slot < SRQ_DEPTH; slot++) {
		struct ibv_sge sge = {(uintptr_t)(s->mem + slot * MSG), MSG, s->mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad;
		if (ibv_post_recv(s->qp, &wr, &bad))
			die("ibv_post_recv");
	}
	for (uint64_t id = 0; id < n; id++) {
		memcpy(out, &id, 8);
		struct ibv_sge sge = {(uintptr_t)out, MSG, s->mr->lkey};
		struct ibv_send_wr wr = {
			.wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
			.send_flags = IBV_SEND_SIGNALED,
		}, *bad;
		if (ibv_post_send(s->qp, &wr, &bad))
			die("ibv_post_send");
		int sent = 0, answered = 0;
		while (!sent || !answered) {
			int got = ibv_poll_cq(s->cq, 16, wc);
			if (got < 0)
				die("ibv_poll_cq");
			for (int i = 0; i < got; i++) {
				if (wc[i].status != IBV_WC_SUCCESS) {
					fprintf(stderr, "rpc_srv_c client: %s\n", ibv_wc_status_str(wc[i].status));
					exit(1);
				}
				if (!(wc[i].opcode & IBV_WC_RECV)) {
					sent = 1;
					continue;
				}
				uint64_t back;
				memcpy(&back, s->mem + wc[i].wr_id * MSG, 8);
				if (back != id) {
					fprintf(stderr, "rpc_srv_c client: reply %llu to request %llu\n",
						(unsigned long long)back, (unsigned long long)id);
					exit(1);
				}
				answered = 1;
				struct ibv_sge r = {(uintptr_t)(s->mem + wc[i].wr_id * MSG), MSG, s->mr->lkey};
				struct ibv_recv_wr rw = {.wr_id = wc[i].wr_id, .sg_list = &r, .num_sge = 1}, *rb;
				if (ibv_post_recv(s->qp, &rw, &rb))
					die("ibv_post_recv");
			}
		}
	}
}

int main(int argc, char **argv)
{
	int server = argc > 1 && strcmp(argv[1], "server") == 0;
	const char *addr = NULL;
	int port = 18515;
	uint64_t n = 1000;
	int at = 2;
	if (!server) {
		if (argc < 3 || strcmp(argv[1], "client") != 0)
			goto usage;
		addr = argv[2];
		at = 3;
	}
	for (; at + 1 < argc; at += 2) {
		if (strcmp(argv[at], "-p") == 0)
			port = atoi(argv[at + 1]);
		else if (strcmp(argv[at], "-n") == 0)
			n = strtoull(argv[at + 1], NULL, 10);
		else
			goto usage;
	}
	if (at != argc)
		goto usage;

	struct side s;
	open_side(&s, server, (SRQ_DEPTH + SEND_DEPTH) * MSG);
	struct wire mine = ours(&s), peer;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		die("socket");
	if (server) {
		for (uint64_t slot = 0; slot < SRQ_DEPTH; slot++)
			post_srq_recv(&s, slot);
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 1))
			die("bind/listen");
		int c = accept(fd, NULL, NULL);
		if (c < 0)
			die("accept");
		full(c, &peer, sizeof peer, 0);
		connect_qp(&s, &peer);
		full(c, &mine, sizeof mine, 1);
		serve(&s, n);
		close(c);
	} else {
		if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
			goto usage;
		/* The server may be slow to start (traced): retry for 20 minutes. */
		for (int tries = 0; connect(fd, (struct sockaddr *)&sa, sizeof sa); tries++) {
			if (tries > 12000)
				die("connect");
			close(fd);
			usleep(100000);
			fd = socket(AF_INET, SOCK_STREAM, 0);
		}
		full(fd, &mine, sizeof mine, 1);
		full(fd, &peer, sizeof peer, 0);
		connect_qp(&s, &peer);
		run_client(&s, n);
	}
	close(fd);
	return 0;
usage:
	fprintf(stderr, "usage: rpc_srv_c server -p PORT -n N | client ADDR -p PORT -n N\n");
	return 2;
}
