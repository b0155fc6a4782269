// The NCCL functions of a build without NCCL (TROUPE_HAVE_NCCL off): each
// says so, so a job that asks for NCCL fails with the reason, not a link
// error or a silent fallback.
#include "collectives/nccl_communicator.h"

namespace troupe::collectives {
namespace {

constexpr const char* kNotBuilt =
    "this troupe was built without NCCL (configure with the CUDA toolkit and NCCL installed, "
    "TROUPE_CUDA=AUTO or ON)";

}  // namespace

bool ncclBuilt() { return false; }

std::string ncclUnavailableReason() { return kNotBuilt; }

int ncclDevices() { return 0; }

Expected<std::string> makeNcclId() { return Status::unavailable(kNotBuilt); }

Expected<std::unique_ptr<Communicator>> createNcclCommunicator(NcclOptions) {
  return Status::unavailable(std::string("NCCL communicator: ") + kNotBuilt);
}

}  // namespace troupe::collectives
