/*
 * The C baseline of examples/qp_setup.rs: the same verbs with the same
 * attributes on the same device, so the two compare per queue pair.
 * N RC queue pairs on side a, N on side b, pair i of one connected to
 * pair i of the other (loopback). Timed: create + INIT for all 2N, then
 * RTR + RTS for all 2N. Memory: Anonymous and Rss minus Anonymous from
 * /proc/self/smaps_rollup (exact: a page table walk) before the first
 * queue pair and after the last.
 * The port, GID and device limits are read once, before the clock starts,
 * as a C program written for speed would.
 *
 *   qp_setup N [--send-wr S] [--recv-wr R]      (defaults 128, 128)
 *
 * Build: cc -O2 -o qp_setup qp_setup.c -libverbs
 */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void die(const char *what)
{
	perror(what);
	exit(1);
}

struct resident {
	long anon, file;
};

static long status_kib(const char *text, const char *name)
{
	const char *at = strstr(text, name);
	return at ? strtol(at + strlen(name), NULL, 10) : -1;
}

static struct resident resident(void)
{
	char text[8192];
	FILE *f = fopen("/proc/self/smaps_rollup", "r");
	if (!f)
		die("/proc/self/smaps_rollup");
	size_t len = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	text[len] = 0;
	long rss = status_kib(text, "\nRss:"), anon = status_kib(text, "\nAnonymous:");
	struct resident r = {anon, rss - anon};
	return r;
}

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* The GID the crate chooses on rxe: the first IPv4-mapped entry. */
static int ipv4_mapped_gid(struct ibv_context *ctx, int len, union ibv_gid *gid)
{
	static const unsigned char prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	for (int i = 0; i < len; i++)
		if (ibv_query_gid(ctx, 1, i, gid) == 0 && memcmp(gid->raw, prefix, 12) == 0)
			return i;
	fprintf(stderr, "qp_setup: no IPv4-mapped GID on port 1\n");
	exit(1);
}

struct setup {
	struct ibv_pd *pd;
	struct ibv_device_attr dev;
	struct ibv_port_attr port;
	union ibv_gid gid;
	int gid_index;
	unsigned send_wr, recv_wr;
};

static struct ibv_qp *create_init(const struct setup *s, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_RC,
		.cap = {s->send_wr, s->recv_wr, 4, 4, 64},
	};
	struct ibv_qp *qp = ibv_create_qp(s->pd, &init);
	if (!qp)
		die("ibv_create_qp");
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("ibv_modify_qp INIT");
	return qp;
}

static void rtr_rts(const struct setup *s, struct ibv_qp *qp, unsigned psn, unsigned peer_qpn,
		    unsigned peer_psn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = s->port.active_mtu < IBV_MTU_4096 ? s->port.active_mtu : IBV_MTU_4096,
		.dest_qp_num = peer_qpn,
		.rq_psn = peer_psn,
		.max_dest_rd_atomic = s->dev.max_qp_rd_atom ? s->dev.max_qp_rd_atom : 1,
		.min_rnr_timer = 12,
		.ah_attr = {
			.is_global = 1,
			.dlid = s->port.lid,
			.port_num = 1,
			.grh = {.dgid = s->gid, .sgid_index = s->gid_index, .hop_limit = 64},
		},
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("ibv_modify_qp RTR");
	struct ibv_qp_attr b = {
		.qp_state = IBV_QPS_RTS,
		.sq_psn = psn,
		.timeout = 14,
		.retry_cnt = 7,
		.rnr_retry = 7,
		.max_rd_atomic = s->dev.max_qp_init_rd_atom ? s->dev.max_qp_init_rd_atom : 1,
	};
	if (ibv_modify_qp(qp, &b, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		die("ibv_modify_qp RTS");
}

int main(int argc, char **argv)
{
	if (argc < 2)
		goto usage;
	int n = atoi(argv[1]);
	struct setup s = {.send_wr = 128, .recv_wr = 128};
	for (int i = 2; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--send-wr"))
			s.send_wr = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--recv-wr"))
			s.recv_wr = atoi(argv[i + 1]);
		else
			goto usage;
	}
	if (n < 1 || argc % 2)
		goto usage;

	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		die("no RDMA device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		die("ibv_open_device");
	if (!(s.pd = ibv_alloc_pd(ctx)))
		die("ibv_alloc_pd");
	if (ibv_query_device(ctx, &s.dev) || ibv_query_port(ctx, 1, &s.port))
		die("ibv_query_device/port");
	s.gid_index = ipv4_mapped_gid(ctx, s.port.gid_tbl_len, &s.gid);

	/* One CQ per side, as deep as the queue pairs' depths add up to, at
	 * most the device's largest: what examples/qp_setup's engines get. */
	long long want = (long long)(s.send_wr + s.recv_wr) * n;
	int cq_depth = want > s.dev.max_cqe ? s.dev.max_cqe : (int)want;
	struct ibv_cq *cq_a = ibv_create_cq(ctx, cq_depth, NULL, NULL, 0);
	struct ibv_cq *cq_b = ibv_create_cq(ctx, cq_depth, NULL, NULL, 0);
	if (!cq_a || !cq_b)
		die("ibv_create_cq");
	struct ibv_qp **qa = calloc(n, sizeof *qa), **qb = calloc(n, sizeof *qb);
	unsigned *psn_a = calloc(n, sizeof *psn_a), *psn_b = calloc(n, sizeof *psn_b);
	srand48(time(NULL));

	struct resident before = resident();
	double t0 = now_us();
	for (int i = 0; i < n; i++)
		qa[i] = create_init(&s, cq_a);
	for (int i = 0; i < n; i++)
		qb[i] = create_init(&s, cq_b);
	double t1 = now_us();
	for (int i = 0; i < n; i++) {
		psn_a[i] = lrand48() & 0xffffff;
		psn_b[i] = lrand48() & 0xffffff;
		rtr_rts(&s, qa[i], psn_a[i], qb[i]->qp_num, psn_b[i]);
		rtr_rts(&s, qb[i], psn_b[i], qa[i]->qp_num, psn_a[i]);
	}
	double t2 = now_us();
	struct resident after = resident();

	double qps = 2.0 * n;
	printf("RESULT impl=c n=%d qps=%d cqs=2 cq_depth=%d send_wr=%u recv_wr=%u "
	       "create_init_us=%.1f rtr_rts_us=%.1f setup_us=%.1f "
	       "anon_kib=%.2f file_kib=%.2f rss_kib=%.2f\n",
	       n, 2 * n, cq_depth, s.send_wr, s.recv_wr, (t1 - t0) / qps,
	       (t2 - t1) / qps, (t2 - t0) / qps, (after.anon - before.anon) / qps,
	       (after.file - before.file) / qps,
	       (after.anon + after.file - before.anon - before.file) / qps);
	for (int i = 0; i < n; i++)
		if (ibv_destroy_qp(qa[i]) || ibv_destroy_qp(qb[i]))
			die("ibv_destroy_qp");
	if (ibv_destroy_cq(cq_a) || ibv_destroy_cq(cq_b))
		die("ibv_destroy_cq");
	ibv_dealloc_pd(s.pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
usage:
	fprintf(stderr, "usage: qp_setup N [--send-wr S] [--recv-wr R]\n");
	return 2;
}
