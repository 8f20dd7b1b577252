#include "collectives/host_layout.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tpudist::collectives {

HostLayout ComputeHostLayout(absl::Span<const std::string> host_ids) {
  HostLayout layout;
  const int world = static_cast<int>(host_ids.size());
  layout.host_of_rank.resize(world);
  layout.local_index.resize(world);
  std::map<std::string, int> index;
  for (int r = 0; r < world; ++r) {
    auto [it, inserted] =
        index.emplace(host_ids[r], static_cast<int>(layout.hosts.size()));
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
  if (const char* env = std::getenv("TPU_DIST_HOST_ID"); env && *env) return env;
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

}  // namespace

BindAddress ResolveBindAddress(const std::string& configured, const std::string& host_id) {
  if (!configured.empty()) return {configured, ""};
  if (const char* env = std::getenv("TPU_DIST_BIND_ADDRESS"); env && *env) return {env, ""};
  const char* hosts = std::getenv("TPU_WORKER_HOSTNAMES");
  const char* id = std::getenv("TPU_WORKER_ID");
  int index = -1;
  if (hosts && id && absl::SimpleAtoi(id, &index) && index >= 0) {
    std::vector<std::string> list = absl::StrSplit(hosts, ',');
    if (index < static_cast<int>(list.size())) {
      const std::string entry(absl::StripAsciiWhitespace(list[index]));
      if (IsNumericAddress(entry)) return {entry, ""};
      // A name (KubeRay's "<group>-0-<j>.<cluster>-headless"): peers reach
      // this host at what it resolves to; listen on every interface.
      if (!entry.empty()) {
        const std::string ip = ResolveIPv4(entry);
        if (!ip.empty()) return {"0.0.0.0", ip};
      }
    }
  }
  if (IsNumericAddress(host_id)) return {host_id, ""};
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  const std::string advertise = ResolveIPv4(name);
  return {"0.0.0.0", advertise.empty() ? "127.0.0.1" : advertise};
}

}  // namespace tpudist::collectives
