#include "apps/token_command.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "transport/node_config.h"

namespace troupe::apps {

void addTokenCommand(CLI::App* app, int* result) {
  auto* cmd = app->add_subcommand("token", "Print a fresh job token, or write it to a new file only you can read");
  auto out = std::make_shared<std::string>();
  cmd->add_option("--out", *out, "write the token to this new file (mode 0600) instead of standard output");
  cmd->callback([=] {
    const std::string token = transport::newJobToken() + "\n";
    if (out->empty()) {
      std::fputs(token.c_str(), stdout);
      *result = std::fflush(stdout) == 0 ? 0 : 1;
      return;
    }
    const int fd = ::open(out->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      std::fprintf(stderr, "troupe token: %s: %s%s\n", out->c_str(), std::strerror(errno),
                   errno == EEXIST ? " (an existing token file is never overwritten)" : "");
      *result = 2;
      return;
    }
    errno = 0;
    const ssize_t wrote = ::write(fd, token.data(), token.size());
    bool ok = wrote == ssize_t(token.size());
    int err = ok || errno != 0 ? errno : ENOSPC;  // (a short write sets no errno)
    if (ok && ::fsync(fd) != 0) {
      ok = false;
      err = errno;
    }
    ::close(fd);
    if (!ok) {
      std::fprintf(stderr, "troupe token: %s: %s\n", out->c_str(), std::strerror(err));
      ::unlink(out->c_str());
      *result = 1;
      return;
    }
    std::printf("wrote a job token to %s (mode 0600): give every process of the job "
                "--set transport.token_file=%s\n", out->c_str(), out->c_str());
    *result = 0;
  });
}

}  // namespace troupe::apps
