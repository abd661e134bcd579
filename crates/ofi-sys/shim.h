/*
 * libfabric declares most of its calls `static inline` in its headers: wrappers that jump through
 * the ops tables of a fid. Rust cannot call a static inline function, so shim.c gives each one we
 * use a real symbol, ferromq_fi_<name>, with the same arguments.
 */
#ifndef FERROMQ_OFI_SHIM_H
#define FERROMQ_OFI_SHIM_H

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>

/* Macros and constants that bindgen cannot evaluate (casts). */
extern const uint64_t ferromq_fi_addr_unspec;

/* Sizes of the structs Rust allocates itself, as the installed headers define them: a test checks
 * the committed bindings against them. */
extern const size_t ferromq_fi_sizeof_context2;
extern const size_t ferromq_fi_sizeof_cq_tagged_entry;
extern const size_t ferromq_fi_sizeof_cq_err_entry;
extern const size_t ferromq_fi_sizeof_cq_attr;
extern const size_t ferromq_fi_sizeof_av_attr;

struct fi_info *ferromq_fi_allocinfo(void);
int ferromq_fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);
int ferromq_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain,
                      void *context);
int ferromq_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep,
                        void *context);
int ferromq_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq,
                       void *context);
int ferromq_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av,
                       void *context);
int ferromq_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int ferromq_fi_enable(struct fid_ep *ep);
int ferromq_fi_close(struct fid *fid);
int ferromq_fi_getname(struct fid *fid, void *addr, size_t *addrlen);
int ferromq_fi_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr,
                         uint64_t flags, void *context);
int ferromq_fi_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count, uint64_t flags);
const char *ferromq_fi_av_straddr(struct fid_av *av, const void *addr, char *buf, size_t *len);
ssize_t ferromq_fi_tsend(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                         fi_addr_t dest_addr, uint64_t tag, void *context);
ssize_t ferromq_fi_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr,
                         uint64_t tag, uint64_t ignore, void *context);
ssize_t ferromq_fi_cancel(struct fid *fid, void *context);
ssize_t ferromq_fi_cq_read(struct fid_cq *cq, void *buf, size_t count);
ssize_t ferromq_fi_cq_sread(struct fid_cq *cq, void *buf, size_t count, const void *cond,
                            int timeout);
ssize_t ferromq_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags);
const char *ferromq_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data,
                                   char *buf, size_t len);
int ferromq_fi_cq_signal(struct fid_cq *cq);
int ferromq_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access,
                      uint64_t offset, uint64_t requested_key, uint64_t flags,
                      struct fid_mr **mr, void *context);
void *ferromq_fi_mr_desc(struct fid_mr *mr);
int ferromq_fi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags);
int ferromq_fi_mr_enable(struct fid_mr *mr);

#endif
