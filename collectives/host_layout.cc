#include "collectives/host_layout.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
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

}  // namespace tpudist::collectives
