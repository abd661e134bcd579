/* Real symbols for libfabric's static inline calls; see shim.h. */
#include "shim.h"

const uint64_t ferromq_fi_addr_unspec = FI_ADDR_UNSPEC;

const size_t ferromq_fi_sizeof_context2 = sizeof(struct fi_context2);
const size_t ferromq_fi_sizeof_cq_tagged_entry = sizeof(struct fi_cq_tagged_entry);
const size_t ferromq_fi_sizeof_cq_err_entry = sizeof(struct fi_cq_err_entry);
const size_t ferromq_fi_sizeof_cq_attr = sizeof(struct fi_cq_attr);
const size_t ferromq_fi_sizeof_av_attr = sizeof(struct fi_av_attr);

struct fi_info *ferromq_fi_allocinfo(void) { return fi_allocinfo(); }

int ferromq_fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context) {
    return fi_fabric(attr, fabric, context);
}

int ferromq_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain,
                      void *context) {
    return fi_domain(fabric, info, domain, context);
}

int ferromq_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep,
                        void *context) {
    return fi_endpoint(domain, info, ep, context);
}

int ferromq_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq,
                       void *context) {
    return fi_cq_open(domain, attr, cq, context);
}

int ferromq_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av,
                       void *context) {
    return fi_av_open(domain, attr, av, context);
}

int ferromq_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags) {
    return fi_ep_bind(ep, bfid, flags);
}

int ferromq_fi_enable(struct fid_ep *ep) { return fi_enable(ep); }

int ferromq_fi_close(struct fid *fid) { return fi_close(fid); }

int ferromq_fi_getname(struct fid *fid, void *addr, size_t *addrlen) {
    return fi_getname(fid, addr, addrlen);
}

int ferromq_fi_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr,
                         uint64_t flags, void *context) {
    return fi_av_insert(av, addr, count, fi_addr, flags, context);
}

int ferromq_fi_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count, uint64_t flags) {
    return fi_av_remove(av, fi_addr, count, flags);
}

const char *ferromq_fi_av_straddr(struct fid_av *av, const void *addr, char *buf, size_t *len) {
    return fi_av_straddr(av, addr, buf, len);
}

ssize_t ferromq_fi_tsend(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                         fi_addr_t dest_addr, uint64_t tag, void *context) {
    return fi_tsend(ep, buf, len, desc, dest_addr, tag, context);
}

ssize_t ferromq_fi_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr,
                         uint64_t tag, uint64_t ignore, void *context) {
    return fi_trecv(ep, buf, len, desc, src_addr, tag, ignore, context);
}

ssize_t ferromq_fi_cancel(struct fid *fid, void *context) { return fi_cancel(fid, context); }

ssize_t ferromq_fi_cq_read(struct fid_cq *cq, void *buf, size_t count) {
    return fi_cq_read(cq, buf, count);
}

ssize_t ferromq_fi_cq_sread(struct fid_cq *cq, void *buf, size_t count, const void *cond,
                            int timeout) {
    return fi_cq_sread(cq, buf, count, cond, timeout);
}

ssize_t ferromq_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags) {
    return fi_cq_readerr(cq, buf, flags);
}

const char *ferromq_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data,
                                   char *buf, size_t len) {
    return fi_cq_strerror(cq, prov_errno, err_data, buf, len);
}

int ferromq_fi_cq_signal(struct fid_cq *cq) { return fi_cq_signal(cq); }

int ferromq_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access,
                      uint64_t offset, uint64_t requested_key, uint64_t flags,
                      struct fid_mr **mr, void *context) {
    return fi_mr_reg(domain, buf, len, access, offset, requested_key, flags, mr, context);
}

void *ferromq_fi_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }

int ferromq_fi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags) {
    return fi_mr_bind(mr, bfid, flags);
}

int ferromq_fi_mr_enable(struct fid_mr *mr) { return fi_mr_enable(mr); }
