// ExceptionMessage: the text of an exception caught at the torch/c10d
// boundary, for an absl::Status. c10::Error::what() appends a C++ backtrace
// of ~20 frames that buries the message a user needs; this returns
// what_without_backtrace() for c10::Error and what() for anything else.
//
// Thread-safe, pure.
#ifndef TPU_DIST_COLLECTIVES_EXCEPTION_MESSAGE_H_
#define TPU_DIST_COLLECTIVES_EXCEPTION_MESSAGE_H_

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace tpudist::collectives {

inline std::string ExceptionMessage(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_EXCEPTION_MESSAGE_H_
