/* A peer written directly on libfabric, with nothing of dma-libfabric and nothing tuned: the
 * provider's own defaults, hints as a plain libfabric program (fabtests) writes them. The interop
 * test runs the library's examples against it, in both roles and both directions, and CI links it
 * against each libfabric version the library is tested on.
 *
 *   fabric_peer target [--read] <bind>        exposes 4096 bytes, prints "advertisement: <hex> <rkey>
 *                                             <addr>"; waits until a write has filled them with 0xab
 *                                             (or, with --read, serves 0xab until it is ended)
 *   fabric_peer write <hex> <rkey> <addr>     writes 4096 bytes of 0xab there
 *   fabric_peer read <hex> <rkey> <addr>      reads 4096 bytes from there and checks they are 0xab
 *
 * FABRIC_PEER_PROVIDER names the provider (default "tcp"); FABRIC_PEER_TIMEOUT the seconds it waits
 * (default 60). Exit 0 when the transfer is verified, 1 on any failure, with the reason on stderr.
 */
#define _DEFAULT_SOURCE /* clock_gettime, strdup, usleep under -std=c11 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { buffer_size = 4096, max_address = 256 };

struct peer {
  struct fi_info* info;
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_av* av;
  struct fid_cq* cq;
  struct fid_ep* ep;
  struct fid_mr* mr;
  unsigned char buffer[buffer_size];
};

static double timeout_seconds(void) {
  const char* text = getenv("FABRIC_PEER_TIMEOUT");
  const double value = text != NULL ? atof(text) : 0.0;
  return value > 0.0 ? value : 60.0;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int fail(const char* step, int code) {
  fprintf(stderr, "fabric_peer: %s: %s (%d)\n", step, fi_strerror(code < 0 ? -code : code), code);
  return 1;
}

static int open_peer(struct peer* p, const char* bind) {
  struct fi_info* hints = fi_allocinfo();
  if (hints == NULL) return fail("fi_allocinfo", -FI_ENOMEM);
  const char* provider = getenv("FABRIC_PEER_PROVIDER");
  hints->fabric_attr->prov_name = strdup(provider != NULL ? provider : "tcp");
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  /* What a portable program says it can handle; the provider picks what it needs of these. */
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  int ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), bind, NULL, bind != NULL ? FI_SOURCE : 0,
                       hints, &p->info);
  fi_freeinfo(hints);
  if (ret) return fail("fi_getinfo", ret);
  fprintf(stderr, "fabric_peer: libfabric %u.%u, provider %s\n", FI_MAJOR(fi_version()), FI_MINOR(fi_version()),
          p->info->fabric_attr->prov_name);

  if ((ret = fi_fabric(p->info->fabric_attr, &p->fabric, NULL))) return fail("fi_fabric", ret);
  if ((ret = fi_domain(p->fabric, p->info, &p->domain, NULL))) return fail("fi_domain", ret);
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE};
  if ((ret = fi_cq_open(p->domain, &cq_attr, &p->cq, NULL))) return fail("fi_cq_open", ret);
  struct fi_av_attr av_attr = {.type = p->info->domain_attr->av_type};
  if ((ret = fi_av_open(p->domain, &av_attr, &p->av, NULL))) return fail("fi_av_open", ret);
  if ((ret = fi_endpoint(p->domain, p->info, &p->ep, NULL))) return fail("fi_endpoint", ret);
  if ((ret = fi_ep_bind(p->ep, &p->cq->fid, FI_TRANSMIT | FI_RECV))) return fail("fi_ep_bind cq", ret);
  if ((ret = fi_ep_bind(p->ep, &p->av->fid, 0))) return fail("fi_ep_bind av", ret);
  if ((ret = fi_enable(p->ep))) return fail("fi_enable", ret);

  const uint64_t access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  if ((ret = fi_mr_reg(p->domain, p->buffer, buffer_size, access, 0, 0x5eed, 0, &p->mr, NULL)))
    return fail("fi_mr_reg", ret);
  if (p->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
    if ((ret = fi_mr_bind(p->mr, &p->ep->fid, 0))) return fail("fi_mr_bind", ret);
    if ((ret = fi_mr_enable(p->mr))) return fail("fi_mr_enable", ret);
  }
  return 0;
}

static void close_peer(struct peer* p) {
  if (p->mr) fi_close(&p->mr->fid);
  if (p->ep) fi_close(&p->ep->fid);
  if (p->av) fi_close(&p->av->fid);
  if (p->cq) fi_close(&p->cq->fid);
  if (p->domain) fi_close(&p->domain->fid);
  if (p->fabric) fi_close(&p->fabric->fid);
  if (p->info) fi_freeinfo(p->info);
}

static int all_ab(const unsigned char* bytes) {
  for (size_t i = 0; i < buffer_size; ++i)
    if (bytes[i] != 0xab) return 0;
  return 1;
}

/* Reads the completion queue once (which also drives the provider's progress): 1 for a
 * completion, 0 for none, or a negative error, printed with the provider's own words. */
static int poll_cq(struct peer* p) {
  struct fi_cq_entry entry;
  const ssize_t n = fi_cq_read(p->cq, &entry, 1);
  if (n == 1) return 1;
  if (n == -FI_EAGAIN) return 0;
  if (n == -FI_EAVAIL) {
    struct fi_cq_err_entry err = {0};
    char text[256] = "";
    fi_cq_readerr(p->cq, &err, 0);
    fprintf(stderr, "fabric_peer: transfer failed: %s (%s)\n", fi_strerror(err.err),
            fi_cq_strerror(p->cq, err.prov_errno, err.err_data, text, sizeof text));
    return -err.err;
  }
  return fail("fi_cq_read", (int)n) ? -FI_EIO : 0;
}

static int run_target(int serve_read, const char* bind) {
  struct peer p = {0};
  int status = open_peer(&p, bind);
  if (status == 0) {
    unsigned char address[max_address];
    size_t length = sizeof address;
    int ret = fi_getname(&p.ep->fid, address, &length);
    if (ret) {
      status = fail("fi_getname", ret);
    } else {
      memset(p.buffer, serve_read ? 0xab : 0, buffer_size);
      const uint64_t remote_address =
          (p.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)p.buffer : 0;
      printf("advertisement: ");
      for (size_t i = 0; i < length; ++i) printf("%02x", address[i]);
      printf(" %llu %llu\n", (unsigned long long)fi_mr_key(p.mr), (unsigned long long)remote_address);
      printf(serve_read ? "serving 4096 bytes of 0xab for a remote read\n" : "waiting for a write into 4096 bytes\n");
      fflush(stdout);
      const double deadline = now() + timeout_seconds();
      status = 1;
      while (now() < deadline) {
        if (poll_cq(&p) < 0) break;
        if (!serve_read && all_ab(p.buffer)) {
          printf("received 4096 bytes, payload verified\n");
          status = 0;
          break;
        }
        usleep(1000);
      }
      if (serve_read) status = 0; /* ended by the test, or served for the whole timeout */
      else if (status != 0)
        fprintf(stderr, "fabric_peer: no write arrived within %.0f s\n", timeout_seconds());
    }
  }
  close_peer(&p);
  return status;
}

static int decode_hex(const char* text, unsigned char* out, size_t* length) {
  const size_t n = strlen(text);
  if (n % 2 != 0 || n / 2 > max_address) return -1;
  for (size_t i = 0; i < n / 2; ++i) {
    unsigned value;
    if (sscanf(text + 2 * i, "%2x", &value) != 1) return -1;
    out[i] = (unsigned char)value;
  }
  *length = n / 2;
  return 0;
}

static int run_initiator(int read, const char* hex, const char* key_text, const char* address_text) {
  unsigned char address[max_address];
  size_t length = 0;
  if (decode_hex(hex, address, &length) != 0) {
    fprintf(stderr, "fabric_peer: the address is not hex\n");
    return 1;
  }
  const uint64_t key = strtoull(key_text, NULL, 10);
  const uint64_t remote_address = strtoull(address_text, NULL, 10);

  struct peer p = {0};
  int status = open_peer(&p, NULL);
  fi_addr_t peer_address = FI_ADDR_UNSPEC;
  if (status == 0 && fi_av_insert(p.av, address, 1, &peer_address, 0, NULL) != 1)
    status = fail("fi_av_insert", -FI_EINVAL);
  if (status == 0) {
    memset(p.buffer, read ? 0 : 0xab, buffer_size);
    void* desc = fi_mr_desc(p.mr);
    const double deadline = now() + timeout_seconds();
    ssize_t ret = -FI_EAGAIN;
    while (ret == -FI_EAGAIN && now() < deadline) {
      ret = read ? fi_read(p.ep, p.buffer, buffer_size, desc, peer_address, remote_address, key, NULL)
                 : fi_write(p.ep, p.buffer, buffer_size, desc, peer_address, remote_address, key, NULL);
      if (ret == -FI_EAGAIN) {
        if (poll_cq(&p) < 0) break;
        usleep(100);
      }
    }
    if (ret != 0) {
      status = fail(read ? "fi_read" : "fi_write", (int)(ret == -FI_EAGAIN ? -FI_ETIMEDOUT : ret));
    } else {
      int done = 0;
      while (done == 0 && now() < deadline) {
        done = poll_cq(&p);
        if (done == 0) usleep(100);
      }
      if (done <= 0) {
        status = done == 0 ? fail("waiting for the completion", -FI_ETIMEDOUT) : 1;
      } else if (read && !all_ab(p.buffer)) {
        fprintf(stderr, "fabric_peer: the bytes read are not the 0xab the target serves\n");
        status = 1;
      } else {
        printf(read ? "read 4096 bytes, payload verified\n" : "wrote 4096 bytes\n");
      }
    }
  }
  close_peer(&p);
  return status;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 3 && strcmp(argv[1], "target") == 0) {
    const int serve_read = strcmp(argv[2], "--read") == 0;
    if (argc == 3 + serve_read) return run_target(serve_read, argv[2 + serve_read]);
  } else if (argc == 5 && (strcmp(argv[1], "write") == 0 || strcmp(argv[1], "read") == 0)) {
    return run_initiator(strcmp(argv[1], "read") == 0, argv[2], argv[3], argv[4]);
  }
  fprintf(stderr,
          "usage: fabric_peer target [--read] <bind>\n"
          "       fabric_peer write|read <address-hex> <rkey> <remote-addr>\n");
  return 2;
}
