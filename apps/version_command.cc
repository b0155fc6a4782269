#include "apps/version_command.h"

#include <cstdio>

#include <caf/config.hpp>
#include <capnp/common.h>
#include <cblas.h>
#include <spdlog/version.h>
#include <ucp/api/ucp.h>

#include "common/huge_pages.h"
#include "kernels/cpu/blas_core.h"
#include "ps/embedding_table.h"
#include "troupe/config.h"

namespace troupe::apps {

void addVersionCommand(CLI::App* app, int* result) {
  auto* cmd = app->add_subcommand("version", "Print the versions of troupe and its libraries");
  cmd->callback([=] {
    unsigned ucxMajor = 0, ucxMinor = 0, ucxRelease = 0;
    ucp_get_version(&ucxMajor, &ucxMinor, &ucxRelease);
    std::printf("troupe %s\n", TROUPE_VERSION);
    std::printf("  CAF          %d.%d.%d\n", CAF_VERSION / 10000, (CAF_VERSION / 100) % 100, CAF_VERSION % 100);
    std::printf("  UCX          %u.%u.%u (%s)\n", ucxMajor, ucxMinor, ucxRelease, ucp_get_version_string());
    std::printf("  Cap'n Proto  %d.%d.%d\n", CAPNP_VERSION_MAJOR, CAPNP_VERSION_MINOR, CAPNP_VERSION_MICRO);
    std::printf("  spdlog       %d.%d.%d\n", SPDLOG_VER_MAJOR, SPDLOG_VER_MINOR, SPDLOG_VER_PATCH);
    std::printf("  OpenBLAS     %s\n", openblas_get_config());
    std::printf("  BLAS core    %s\n", kernels::describeBlasCore().c_str());
    std::printf("  huge pages   transparent huge pages \"%s\" (an embedding table asks for them from %zu MiB on)\n",
                transparentHugePages().c_str(), ps::EmbeddingTableOptions{}.hugePagesFromBytes >> 20);
    std::printf("  CUDA         %s\n", TROUPE_HAVE_CUDA ? "built" : "not built");
    *result = 0;
  });
}

}  // namespace troupe::apps
