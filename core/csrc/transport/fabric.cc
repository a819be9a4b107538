// `fabric` transport: libfabric RDM endpoints, RMA write with remote CQ data (32-bit immediate).
//
// One endpoint per proxy thread, each in its own fabric/domain (FI_THREAD_DOMAIN: no locks in the
// provider). libfabric is dlopen'ed: only fi_getinfo / fi_freeinfo / fi_dupinfo / fi_fabric /
// fi_strerror / fi_version are real symbols; everything else in the API is an inline call through
// the objects' ops tables, so nothing links against libfabric.
//
// Provider facts this code relies on (as libfabric 1.17, Debian's, behaves over 127.0.0.1):
// - tcp;ofi_rxm returns mode = 0 and mr_mode = 0: remote addresses are offsets and the MR key is
//   the one we request; shm/efa return FI_MR_VIRT_ADDR (+ PROV_KEY on efa): address = base + off.
//   The opaque key blob {key, base} covers both; the application only ever passes offsets.
// - the receiver must learn the writer's rank without spending immediate bits on it. FI_SOURCE
//   does NOT do it on tcp;ofi_rxm 1.17 (fi_cq_readfrom reports address 0 for every remote write,
//   measured), so providers that carry >= 8 bytes of CQ data (tcp, rxm, shm, sockets) get the
//   source rank in the upper 32 bits; 4-byte providers (efa, verbs) must grant FI_SOURCE, whose
//   fi_addr is mapped back to the rank (AV index = rank).
// - rxm connects lazily and needs progress on both sides: the first write returns -FI_EAGAIN
//   until polls on both endpoints complete the handshake.
// - a write outside the target MR completes *successfully* at the initiator; the target's provider
//   drops it with a log line and tears the connection down (later writes vanish too; tcp;ofi_rxm
//   1.17); efa tells only the initiator. So such a write is never posted: the endpoint checks each
//   write against the peer's region (from connect) and sends the peer a refusal notice instead, a
//   zero-length write whose CQ data the receiver turns into kRemoteError naming the writer; the
//   writer gets kLocalError(EFAULT).
// - a write to a dead peer completes once (into the socket buffer), then fails with
//   FI_ENOTCONN-class errors: the proxy turns those into PeerFailure.
#include <algorithm>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>

#include <deque>
#include <vector>

#include "runtime/cuda_driver.h"
#include "runtime/dynlib.h"
#include "transport/fabric_internal.h"
#include "transport/transport.h"
#include "transport/wire.h"
#include "uccl_ep/immediate.h"

#if defined(UCCL_EP_HAVE_FABRIC_HEADERS)
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#endif

namespace uccl_ep {
namespace transport {

#if defined(UCCL_EP_HAVE_FABRIC_HEADERS)
namespace fabric_detail {

const Api& api() {
  static const Api a = [] {
    Api x;
    void* h = runtime::open_library("fabric", &x.error);
    if (h == nullptr) {
      x.error = "libfabric is not loadable (" + x.error + "); install libfabric1 (Debian/Ubuntu) or the EFA installer";
      return x;
    }
    x.getinfo = reinterpret_cast<decltype(x.getinfo)>(dlsym(h, "fi_getinfo"));
    x.freeinfo = reinterpret_cast<decltype(x.freeinfo)>(dlsym(h, "fi_freeinfo"));
    x.dupinfo = reinterpret_cast<decltype(x.dupinfo)>(dlsym(h, "fi_dupinfo"));
    x.fabric = reinterpret_cast<decltype(x.fabric)>(dlsym(h, "fi_fabric"));
    x.strerror = reinterpret_cast<decltype(x.strerror)>(dlsym(h, "fi_strerror"));
    x.version = reinterpret_cast<decltype(x.version)>(dlsym(h, "fi_version"));
    if (!x.getinfo || !x.freeinfo || !x.dupinfo || !x.fabric || !x.strerror || !x.version) {
      x.getinfo = nullptr;
      x.error = "libfabric loaded but lacks fi_getinfo/fi_fabric/...; it is too old or broken";
    }
    return x;
  }();
  return a;
}

fi_info* rma_hints(const std::string& provider, bool hmem) {
  fi_info* hints = api().dupinfo(nullptr);
  hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_SOURCE | (hmem ? FI_HMEM : 0);
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT |
                                (hmem ? FI_MR_HMEM : 0);
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  return hints;
}

// NOTES: ask for the 1.18 API when the library has it: older API versions make efa emulate RDMA
// writes on p5/p5e (Mooncake's production notes).
uint32_t api_version() {
  const uint32_t lib = api().version();
  return lib >= FI_VERSION(1, 18) ? FI_VERSION(1, 18) : FI_VERSION(1, 17);
}

}  // namespace fabric_detail

namespace {

using namespace fabric_detail;

std::string fi_err(const char* what, long rc) {
  return std::string(what) + " failed: " + std::to_string(rc) + " (" + api().strerror(int(-rc)) + ")";
}

// Refusal notice. 8-byte CQ data: bit 63, source rank + 1 in [32, 63), the offset in 16-byte units
// in [0, 32). 4-byte CQ data: kNoticeImm, a control immediate the proxy never sends.
constexpr uint64_t kNoticeBit = uint64_t(1) << 63;
constexpr uint32_t kNoticeImm = 0xFFFFFFFFu;
static_assert(imm::kind(kNoticeImm) == imm::kControl && imm::op(kNoticeImm) == 63 && imm::kOpGoodbye < 63,
              "the refusal notice must stay a control immediate the proxy never sends");

uint64_t fnv1a(const std::string& s, uint64_t salt) {
  uint64_t h = 1469598103934665603ull ^ salt;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

class FabricTransport final : public Transport {
 public:
  explicit FabricTransport(const Options& opt) : opt_(opt) {
    if (api().getinfo == nullptr) throw TransportError(api().error);
    std::vector<std::string> tried;
    if (!opt.provider.empty()) {
      open(opt.provider, &tried);
    } else {
      for (const char* p : kDefaultProviders)
        if (open(p, &tried)) break;
    }
    if (ep_ == nullptr) {
      std::string why;
      for (const auto& t : tried) why += "\n  " + t;
      if (hmem())
        throw TransportError("no libfabric provider can register the region in GPU " +
                             std::to_string(opt_.hmem_cuda_device) +
                             "'s memory (FI_HMEM) for RDM + RMA write with remote CQ data:" + why +
                             "\n  the GPU proxy path over a network needs GPUDirect RDMA: efa with FI_HMEM "
                             "(nvidia-peermem or dma-buf), or verbs;ofi_rxm with nvidia-peermem; tcp;ofi_rxm cannot");
      throw TransportError("no usable libfabric provider for RDM + RMA write with remote CQ data:" + why);
    }
  }

  ~FabricTransport() override {
    // NOTES: endpoint before AV / CQ / MR (Mooncake's EFA notes), then domain and fabric.
    if (ep_) fi_close(&ep_->fid);
    if (mr_) fi_close(&mr_->fid);
    if (av_) fi_close(&av_->fid);
    if (cq_) fi_close(&cq_->fid);
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    if (info_) api().freeinfo(info_);
  }

  std::string name() const override { return std::string("fabric:") + info_->fabric_attr->prov_name; }
  std::string device() const override {
    return info_->domain_attr->name != nullptr ? info_->domain_attr->name : "";
  }
  Caps caps() const override {
    Caps c;
    c.ordered = (info_->tx_attr->msg_order & FI_ORDER_WAW) != 0;
    c.remote_bounds_checked = true;  // the provider at the target; reported by refusal notices
    c.max_write_bytes = info_->ep_attr->max_msg_size;
    c.max_outstanding = uint32_t(ops_.size());
    return c;
  }

  void register_region(void* base, uint64_t bytes) override {
    region_ = static_cast<uint8_t*>(base);
    region_bytes_ = bytes;
    const uint64_t mr_mode = info_->domain_attr->mr_mode;
    // A requested key derived from the job token: a process of another job cannot guess it.
    uint64_t key = fnv1a(opt_.job_key, uint64_t(opt_.thread_index) + 1);
    if (info_->domain_attr->mr_key_size < 8) key &= (uint64_t(1) << (8 * info_->domain_attr->mr_key_size)) - 1;
    int rc = 0;
    if (hmem()) {
      // NOTES: GPU memory is registered through fi_mr_regattr naming its interface and device, so
      // the provider pins it for the NIC (GPUDirect RDMA) instead of treating it as host pages.
      iovec iov{base, size_t(bytes)};
      fi_mr_attr attr{};
      attr.mr_iov = &iov;
      attr.iov_count = 1;
      attr.access = FI_WRITE | FI_REMOTE_WRITE;
      attr.requested_key = key;
      // The process's GPU runtime says whose memory it is: ROCr's (AMD, under a ROCm torch) or CUDA's.
      const bool rocr = runtime::cu::runtime_name() == "hip";
      attr.iface = rocr ? FI_HMEM_ROCR : FI_HMEM_CUDA;
      if (rocr) attr.device.reserved = 0;  // ROCr memory is found by its address (libfabric's rocr hmem)
      else attr.device.cuda = opt_.hmem_cuda_device;
      rc = fi_mr_regattr(domain_, &attr, 0, &mr_);
      if (rc)
        throw TransportError(fi_err(("fi_mr_regattr of the region in GPU " + std::to_string(opt_.hmem_cuda_device) +
                                     "'s memory (" + (rocr ? "FI_HMEM_ROCR" : "FI_HMEM_CUDA") + ")").c_str(), rc));
    } else {
      rc = fi_mr_reg(domain_, base, bytes, FI_WRITE | FI_REMOTE_WRITE, 0, key, 0, &mr_, nullptr);
      if (rc) throw TransportError(fi_err("fi_mr_reg of the region", rc));
    }
    if (mr_mode & FI_MR_ENDPOINT) {
      if ((rc = fi_mr_bind(mr_, &ep_->fid, 0)) || (rc = fi_mr_enable(mr_))) throw TransportError(fi_err("fi_mr_bind", rc));
    }
    desc_ = fi_mr_desc(mr_);
    key_ = fi_mr_key(mr_);
    base_ = (mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(base) : 0;
  }

  Bytes local_address() override {
    Bytes b(256);
    size_t len = b.size();
    int rc = fi_getname(&ep_->fid, b.data(), &len);
    if (rc) throw TransportError(fi_err("fi_getname", rc));
    b.resize(len);
    return b;
  }
  Bytes region_key() override {
    Bytes b;
    put_u64(b, key_);
    put_u64(b, base_);
    return b;
  }

  void connect(const std::vector<Bytes>& addresses, const std::vector<Bytes>& keys,
               const std::vector<uint64_t>& region_bytes) override {
    peers_.assign(addresses.size(), Peer{});
    for (size_t r = 0; r < addresses.size(); ++r) {
      if (addresses[r].empty() && keys[r].empty()) {  // a split transport's other half reaches this rank
        peers_[r] = {FI_ADDR_NOTAVAIL, 0, 0, region_bytes[r], false};
        continue;
      }
      fi_addr_t fa = FI_ADDR_NOTAVAIL;
      int rc = fi_av_insert(av_, addresses[r].data(), 1, &fa, 0, nullptr);
      if (rc != 1) throw TransportError("fi_av_insert of rank " + std::to_string(r) + "'s address failed (" +
                                        std::to_string(rc) + ")");
      if (keys[r].size() != 16) throw TransportError("malformed region key of rank " + std::to_string(r));
      peers_[r] = {fa, get_u64(keys[r], 0), get_u64(keys[r], 8), region_bytes[r], true};
      rank_of_.resize(std::max<size_t>(rank_of_.size(), size_t(fa) + 1), -1);
      rank_of_[size_t(fa)] = int(r);
    }
  }

  PostResult write(int peer, uint64_t local_off, uint64_t remote_off, uint64_t len, bool has_imm, uint32_t imm,
                   uint64_t ctx, std::string* error) override {
    if (peer < 0 || size_t(peer) >= peers_.size()) {
      if (error) *error = "fabric: no such peer " + std::to_string(peer);
      return PostResult::kError;
    }
    const Peer& p = peers_[size_t(peer)];
    if (!p.served) {
      if (error) *error = "fabric: rank " + std::to_string(peer) + " is not reached through fabric (same node)";
      return PostResult::kError;
    }
    if (local_off > region_bytes_ || len > region_bytes_ - local_off) {
      if (error)
        *error = "fabric: source range [" + std::to_string(local_off) + ", +" + std::to_string(len) +
                 ") is outside this rank's region of " + std::to_string(region_bytes_) + " bytes";
      return PostResult::kError;
    }
    if (remote_off > p.bytes || len > p.bytes - remote_off) return refuse(peer, remote_off, len, ctx);
    if (free_.empty()) return PostResult::kAgain;
    const uint32_t slot = free_.back();
    Op& op = ops_[slot];
    op.ctx = ctx;
    op.peer = peer;
    op.notice = false;
    // NOTES: a zero-length write still passes a valid local address (shm hangs on NULL).
    void* src = region_ + local_off;
    const uint64_t data = source_in_data_ ? (uint64_t(opt_.rank + 1) << 32) | imm : imm;
    ssize_t rc = has_imm ? fi_writedata(ep_, src, len, desc_, data, p.addr, p.base + remote_off, p.key, &op.fi_ctx)
                         : fi_write(ep_, src, len, desc_, p.addr, p.base + remote_off, p.key, &op.fi_ctx);
    if (rc == -FI_EAGAIN) return PostResult::kAgain;
    if (rc != 0) {
      if (error) *error = fi_err(has_imm ? "fi_writedata" : "fi_write", rc);
      return PostResult::kError;
    }
    free_.pop_back();
    return PostResult::kOk;
  }

  size_t poll(std::vector<Completion>& out, size_t max) override {
    fi_cq_data_entry entries[32];
    fi_addr_t sources[32];
    size_t n = 0;
    post_notices();
    while (n < max && !refused_.empty()) {
      out.push_back(std::move(refused_.front()));
      refused_.pop_front();
      ++n;
    }
    while (n < max) {
      const size_t want = std::min<size_t>(32, max - n);
      ssize_t got = fi_cq_readfrom(cq_, entries, want, sources);
      if (got == -FI_EAGAIN) break;
      if (got == -FI_EAVAIL) {
        n += read_error(out);
        continue;
      }
      if (got < 0) {
        out.push_back({Completion::kLocalError, -1, 0, 0, int(-got), fi_err("fi_cq_readfrom", got)});
        return n + 1;
      }
      for (ssize_t i = 0; i < got; ++i) {
        const fi_cq_data_entry& e = entries[i];
        if (e.flags & FI_REMOTE_CQ_DATA) {
          int src = -1;
          bool notice = false;
          if (source_in_data_) {
            const uint64_t tag = (e.data & ~kNoticeBit) >> 32;
            src = tag >= 1 && tag <= peers_.size() ? int(tag - 1) : -1;
            notice = (e.data & kNoticeBit) != 0;
          } else if (sources[i] < rank_of_.size()) {
            src = rank_of_[size_t(sources[i])];
            notice = uint32_t(e.data) == kNoticeImm;
          }
          if (src < 0)
            out.push_back({Completion::kRemoteError, -1, 0, 0, EPROTO, "write with immediate from an address outside the group"});
          else if (notice)
            out.push_back({Completion::kRemoteError, src, 0, 0, EFAULT, notice_text(src, e.data)});
          else
            out.push_back({Completion::kRemoteImm, src, uint32_t(e.data & 0xFFFFFFFFu), 0, 0, {}});
        } else if (e.op_context != nullptr) {
          Op* op = static_cast<Op*>(e.op_context);
          free_.push_back(uint32_t(op - ops_.data()));
          if (op->notice) continue;  // our own refusal notice: the writer was told at posting
          out.push_back({Completion::kLocalDone, op->peer, 0, op->ctx, 0, {}});
        }
        ++n;
      }
      if (size_t(got) < want) break;
    }
    return n;
  }

 private:
  struct Peer {
    fi_addr_t addr;
    uint64_t key;
    uint64_t base;
    uint64_t bytes;
    bool served;  // false: another transport reaches this rank (split transport)
  };
  struct Op {
    fi_context2 fi_ctx;  // provider scratch (FI_CONTEXT / FI_CONTEXT2 modes); must stay first
    uint64_t ctx;
    int peer;
    bool notice;         // a refusal notice (no user completion)
  };

  // A write outside the peer's region: kLocalError(EFAULT) for the writer, a notice for the peer
  // (ordered like any write, so it never overtakes earlier writes on an ordered endpoint).
  PostResult refuse(int peer, uint64_t remote_off, uint64_t len, uint64_t ctx) {
    refused_.push_back({Completion::kLocalError, peer, 0, ctx, EFAULT, "rank " + std::to_string(peer) +
        " refused the write: target range [" + std::to_string(remote_off) + ", +" + std::to_string(len) +
        ") is outside its region of " + std::to_string(peers_[size_t(peer)].bytes) + " bytes (checked before posting)"});
    const uint64_t at = std::min<uint64_t>(remote_off / 16, 0x7FFFFFFFull);
    notices_.push_back({peer, source_in_data_ ? kNoticeBit | (uint64_t(opt_.rank + 1) << 32) | at : kNoticeImm});
    post_notices();
    return PostResult::kOk;
  }

  // Posts pending refusal notices (a provider still connecting, -FI_EAGAIN, gets them later).
  void post_notices() {
    while (!notices_.empty() && !free_.empty()) {
      const auto [peer, data] = notices_.front();
      const Peer& p = peers_[size_t(peer)];
      Op& op = ops_[free_.back()];
      op.ctx = 0, op.peer = peer, op.notice = true;
      const ssize_t rc = fi_writedata(ep_, region_, 0, desc_, data, p.addr, p.base, p.key, &op.fi_ctx);
      if (rc == -FI_EAGAIN) return;
      free_.pop_back();
      notices_.pop_front();
      if (rc != 0) free_.push_back(uint32_t(&op - ops_.data()));  // the writer was told; the peer's wait bounds it
    }
  }

  std::string notice_text(int src, uint64_t data) const {
    return "rank " + std::to_string(src) + " addressed a write" + (source_in_data_ ? " at byte offset " +
           std::to_string((data & 0x7FFFFFFFull) * 16) : std::string()) + " outside this rank's region of " +
           std::to_string(region_bytes_) + " bytes (refused by its fabric endpoint; nothing was written)";
  }

  size_t read_error(std::vector<Completion>& out) {
    fi_cq_err_entry err{};
    if (fi_cq_readerr(cq_, &err, 0) != 1) return 0;
    char buf[256];
    const char* prov = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof buf);
    std::string detail = std::string(api().strerror(err.err)) + (prov ? std::string(" / ") + prov : "");
    if (err.op_context != nullptr && !(err.flags & FI_REMOTE_CQ_DATA)) {
      Op* op = static_cast<Op*>(err.op_context);
      free_.push_back(uint32_t(op - ops_.data()));
      if (op->notice) return 0;  // a refusal notice that did not arrive: the writer already knows
      out.push_back({Completion::kLocalError, op->peer, 0, op->ctx, err.err, detail});
    } else {
      out.push_back({Completion::kRemoteError, -1, 0, 0, err.err, "incoming transfer failed: " + detail});
    }
    return 1;
  }

  bool hmem() const { return opt_.hmem_cuda_device >= 0; }

  // Tries one provider; on failure records why in *tried and returns false.
  bool open(const std::string& provider, std::vector<std::string>* tried) {
    fi_info* hints = rma_hints(provider, hmem());
    // NOTES: with several NICs per GPU (p5en: 2 EFA devices per H200) the proxy threads are spread
    // over them (Options::domain, chosen per thread by the proxy): each thread's endpoint, CQ and
    // MR live on its own NIC, so the threads' traffic adds up instead of sharing one device.
    if (!opt_.domain.empty()) hints->domain_attr->name = strdup(opt_.domain.c_str());
    fi_info* info = nullptr;
    int rc = api().getinfo(api_version(), nullptr, nullptr, 0, hints, &info);
    api().freeinfo(hints);
    if (rc != 0 || info == nullptr) {
      tried->push_back(provider + (opt_.domain.empty() ? "" : " on domain '" + opt_.domain + "'") + ": " +
                       fi_err("fi_getinfo", rc) + (hmem() ? " (asked for FI_HMEM: GPU memory)" : "") +
                       (opt_.domain.empty() ? "" : " (UCCL_EP_FABRIC_DOMAINS: list the NICs with `fi_info -p <provider>`)"));
      return false;
    }
    if (!opt_.domain.empty()) {
      // NOTES: some providers ignore the domain name in the hints (tcp in libfabric 1.17), so pick
      // the entry ourselves; the first match keeps the provider's preference order.
      fi_info* match = nullptr;
      std::string seen;
      for (fi_info* i = info; i != nullptr; i = i->next) {
        const char* d = i->domain_attr != nullptr ? i->domain_attr->name : nullptr;
        if (d == nullptr) continue;
        if (match == nullptr && opt_.domain == d) match = i;
        if (seen.find(std::string("'") + d + "'") == std::string::npos) seen += (seen.empty() ? "'" : ", '") + std::string(d) + "'";
      }
      if (match == nullptr) {
        tried->push_back(provider + ": no domain '" + opt_.domain + "' (UCCL_EP_FABRIC_DOMAINS); it has " +
                         (seen.empty() ? std::string("none") : seen));
        api().freeinfo(info);
        return false;
      }
      fi_info* chosen = api().dupinfo(match);
      api().freeinfo(info);
      info = chosen;
    }
    if (info->mode & FI_RX_CQ_DATA) {
      tried->push_back(provider + ": needs FI_RX_CQ_DATA (posted receives per immediate), not supported");
      api().freeinfo(info);
      return false;
    }
    if (info->domain_attr->cq_data_size < 4) {
      tried->push_back(provider + ": carries fewer than 4 bytes of CQ data");
      api().freeinfo(info);
      return false;
    }
    source_in_data_ = info->domain_attr->cq_data_size >= 8;
    if (!source_in_data_ && !(info->caps & FI_SOURCE)) {
      tried->push_back(provider + ": 4-byte CQ data and no FI_SOURCE: cannot tell which rank wrote");
      api().freeinfo(info);
      return false;
    }
    info_ = info;
    std::string step;
    int r = 0;
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.size = std::max<size_t>(4096, info->tx_attr->size + info->rx_attr->size);
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    if ((r = api().fabric(info->fabric_attr, &fabric_, nullptr))) step = "fi_fabric";
    else if ((r = fi_domain(fabric_, info, &domain_, nullptr))) step = "fi_domain";
    else if ((r = fi_cq_open(domain_, &cq_attr, &cq_, nullptr))) step = "fi_cq_open";
    else if ((r = fi_av_open(domain_, &av_attr, &av_, nullptr))) step = "fi_av_open";
    else if ((r = fi_endpoint(domain_, info, &ep_, nullptr))) step = "fi_endpoint";
    else if ((r = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV))) step = "fi_ep_bind(cq)";
    else if ((r = fi_ep_bind(ep_, &av_->fid, 0))) step = "fi_ep_bind(av)";
    else if ((r = fi_enable(ep_))) step = "fi_enable";
    if (!step.empty()) {
      tried->push_back(provider + ": " + fi_err(step.c_str(), r));
      if (ep_) fi_close(&ep_->fid);
      if (av_) fi_close(&av_->fid);
      if (cq_) fi_close(&cq_->fid);
      if (domain_) fi_close(&domain_->fid);
      if (fabric_) fi_close(&fabric_->fid);
      ep_ = nullptr, av_ = nullptr, cq_ = nullptr, domain_ = nullptr, fabric_ = nullptr;
      api().freeinfo(info_);
      info_ = nullptr;
      return false;
    }
    const size_t depth = std::min<size_t>(info->tx_attr->size, opt_.max_outstanding);
    ops_.resize(std::max<size_t>(depth, 1));
    for (size_t i = 0; i < ops_.size(); ++i) free_.push_back(uint32_t(ops_.size() - 1 - i));
    return true;
  }

  Options opt_;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  fid_mr* mr_ = nullptr;
  void* desc_ = nullptr;
  uint64_t key_ = 0, base_ = 0;
  uint8_t* region_ = nullptr;
  uint64_t region_bytes_ = 0;
  std::vector<Peer> peers_;
  std::vector<int> rank_of_;  // AV index -> rank (FI_SOURCE providers)
  bool source_in_data_ = false;  // upper 32 bits of the CQ data carry the writer's rank + 1
  std::vector<Op> ops_;
  std::vector<uint32_t> free_;
  std::deque<Completion> refused_;  // writes refused at posting, reported by the next poll
  std::deque<std::pair<int, uint64_t>> notices_;  // refusal notices not yet posted: (peer, CQ data)
};

}  // namespace

std::unique_ptr<Transport> make_fabric(const Options& options) { return std::make_unique<FabricTransport>(options); }

std::string fabric_unavailable_reason() {
  if (fabric_detail::api().getinfo == nullptr) return fabric_detail::api().error;
  return "";
}

std::string fabric_probe(const std::string& provider, const std::string& domain, int hmem_cuda_device,
                         std::string* why) {
  Options o;
  o.provider = provider;
  o.domain = domain;
  o.hmem_cuda_device = hmem_cuda_device;
  o.job_key = "probe";
  try {
    return FabricTransport(o).name();
  } catch (const TransportError& e) {
    if (why) *why = e.what();
    return "";
  }
}

#else  // no libfabric headers at build time

std::unique_ptr<Transport> make_fabric(const Options&) {
  throw TransportError("uccl_ep was built without libfabric headers (install libfabric-dev and rebuild)");
}
std::string fabric_unavailable_reason() {
  return "uccl_ep was built without libfabric headers (install libfabric-dev and rebuild)";
}
std::string fabric_probe(const std::string&, const std::string&, int, std::string* why) {
  if (why) *why = fabric_unavailable_reason();
  return "";
}

#endif

}  // namespace transport
}  // namespace uccl_ep
