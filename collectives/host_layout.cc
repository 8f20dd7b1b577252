#include "collectives/host_layout.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tpudist::collectives {

bool HostLayout::uniform_slices() const {
  for (const auto& s : slices) {
    if (s.size() != slices[0].size()) return false;
  }
  return true;
}

Locality LocalityOf(const HostLayout& layout) {
  if (layout.num_slices() > 1) return Locality::kDcn;
  return layout.single_host() ? Locality::kShm : Locality::kIntraSlice;
}

const char* LocalityName(Locality locality) {
  switch (locality) {
    case Locality::kShm:
      return "shm";
    case Locality::kIntraSlice:
      return "intra_slice";
    case Locality::kDcn:
      return "dcn";
  }
  return "?";
}

HostLayout ComputeHostLayout(absl::Span<const std::string> host_ids,
                             absl::Span<const int> slice_ids) {
  HostLayout layout;
  const int world = static_cast<int>(host_ids.size());
  layout.host_of_rank.resize(world);
  layout.local_index.resize(world);
  layout.slice_of_rank.resize(world);
  layout.slice_index.resize(world);
  std::map<int, int> slice_pos;
  std::map<std::pair<int, std::string>, int> index;
  for (int r = 0; r < world; ++r) {
    const int slice_id = slice_ids.empty() ? 0 : slice_ids[r];
    auto [sit, new_slice] =
        slice_pos.emplace(slice_id, static_cast<int>(layout.slices.size()));
    if (new_slice) layout.slices.emplace_back();
    const int s = sit->second;
    layout.slice_of_rank[r] = s;
    layout.slice_index[r] = static_cast<int>(layout.slices[s].size());
    layout.slices[s].push_back(r);
    auto [it, inserted] = index.emplace(std::make_pair(slice_id, host_ids[r]),
                                        static_cast<int>(layout.hosts.size()));
    if (inserted) {
      layout.hosts.emplace_back();
      layout.leaders.push_back(r);
    }
    const int h = it->second;
    layout.host_of_rank[r] = h;
    layout.local_index[r] = static_cast<int>(layout.hosts[h].size());
    layout.hosts[h].push_back(r);
  }
  return layout;
}

std::string DefaultHostId(const std::string& configured) {
  if (!configured.empty()) return configured;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return absl::StrCat(host, "/", absl::StripAsciiWhitespace(boot));
}

bool IsNumericAddress(const std::string& s) {
  unsigned char buf[16];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

namespace {

// The first IPv4 address `name` resolves to, or "" when it resolves to none.
std::string ResolveIPv4(const std::string& name) {
  addrinfo hints = {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string out;
  if (getaddrinfo(name.c_str(), nullptr, &hints, &res) == 0 && res != nullptr) {
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(res->ai_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text))) out = text;
    freeaddrinfo(res);
  }
  return out;
}

// True when this host owns `ip` (it can bind it): the address a name
// resolves to is only bound when it is ours, else the wildcard is needed.
bool IsLocalAddress(const std::string& ip) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (inet_pton(AF_INET, ip.c_str(), &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr) == 1) {
    addr.ss_family = AF_INET;
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, ip.c_str(),
                       &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr) == 1) {
    addr.ss_family = AF_INET6;
    len = sizeof(sockaddr_in6);
  } else {
    return false;
  }
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0;  // port 0
  close(fd);
  return ok;
}

std::string HostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// The address peers dial and how it was found, before any wildcard.
struct Dialable {
  std::string ip;    // numeric; "" = none found
  std::string name;  // the name it was resolved from; "" = given numerically
  std::string what;  // where the name came from, for messages
};

// Rules 2-4 of ResolveBindAddress.
Dialable FindDialable(const std::string& worker_hostname, const std::string& host_id) {
  const std::string entry(absl::StripAsciiWhitespace(worker_hostname));
  if (IsNumericAddress(entry)) return {entry, "", ""};
  // A name (KubeRay's "<group>-0-<j>.<cluster>-headless"): peers reach this
  // host at what it resolves to, so listen there (only there).
  if (!entry.empty()) {
    std::string ip = ResolveIPv4(entry);
    if (!ip.empty()) return {std::move(ip), entry, "this host's TPU_WORKER_HOSTNAMES entry"};
  }
  if (IsNumericAddress(host_id)) return {host_id, "", ""};
  std::string name = HostName();
  std::string ip = ResolveIPv4(name);
  if (ip.empty()) return {"", name, "this host's name (gethostname)"};
  return {std::move(ip), std::move(name), "this host's name (gethostname)"};
}

}  // namespace

absl::StatusOr<BindAddress> ResolveBindAddress(const std::string& configured,
                                               const std::string& worker_hostname,
                                               const std::string& host_id) {
  if (!configured.empty()) {
    if (configured != "0.0.0.0" && configured != "::") return BindAddress{configured, ""};
    // Every interface, on request: peers still need one address to dial.
    const Dialable d = FindDialable(worker_hostname, host_id);
    return BindAddress{configured, d.ip.empty() ? "127.0.0.1" : d.ip};
  }
  const Dialable d = FindDialable(worker_hostname, host_id);
  if (d.ip.empty()) return BindAddress{"127.0.0.1", ""};
  // A name that resolves to an address this host does not own (NAT, a stale
  // /etc/hosts, another machine's entry): binding it fails, and listening on
  // every interface instead must be asked for.
  if (!d.name.empty() && !IsLocalAddress(d.ip)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tpu_dist: ", d.what, " '", d.name, "' resolves to ", d.ip,
        ", which is not an address of this host, so the inter-host TCP listeners have no "
        "address to bind; refusing to listen on every interface unasked. Set "
        "TPU_DIST_BIND_ADDRESS to this host's address that the other hosts can reach, or "
        "TPU_DIST_BIND_ADDRESS=0.0.0.0 to listen on every interface and advertise ", d.ip,
        " (behind NAT), or fix the name's resolution"));
  }
  return BindAddress{d.ip, ""};
}

}  // namespace tpudist::collectives
