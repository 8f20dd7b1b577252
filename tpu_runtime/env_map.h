// EnvMap: a process environment as a plain sorted map, so that discovery and
// slice-environment code can be pure functions of a value (tests build one by
// hand; only EnvMapFromProcess() in env_discovery.h reads the real `environ`).
#ifndef TPU_DIST_TPU_RUNTIME_ENV_MAP_H_
#define TPU_DIST_TPU_RUNTIME_ENV_MAP_H_

#include <map>
#include <string>

namespace tpudist::tpu_runtime {

// An environment as a sorted name -> value map (what a process reads).
// A variable set to the empty string is present with value "".
using EnvMap = std::map<std::string, std::string>;

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_ENV_MAP_H_
