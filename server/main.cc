// thetaserve: an LLM serving server with a paged sparse KV cache (Top-θ attention).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "server/commands.h"

namespace {

void PrintUsage(std::FILE* to) {
  std::fprintf(to,
               "usage: thetaserve <command> [flags]\n"
               "commands:\n"
               "  generate   continue a prompt with a local model, streaming text to stdout\n"
               "  serve      run the gRPC server\n"
               "  client     stream a completion from a running server\n"
               "  status     print a server's running/waiting requests and KV pages\n"
               "  health     check a server's gRPC health (exit 0 when SERVING)\n"
               "  calibrate  calibrate Top-θ thresholds on a text corpus\n"
               "  eval       perplexity of a model on a text file\n"
               "run 'thetaserve <command> --help' for the flags of a command;\n"
               "'thetaserve --version' for the version and the backends built in\n");
}

// What a command that succeeded returns once its output is flushed: 1 when standard output
// could not be written (a full disk under `> file`; it exited 0 with the output cut short).
int Finished(const std::string& command, int rc) {
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;
  if (rc != 0 || (flushed && !std::ferror(stdout))) return rc;
  std::fprintf(stderr, "thetaserve %s: cannot write standard output%s%s\n", command.c_str(),
               flushed ? "" : ": ", flushed ? "" : std::strerror(error));
  return 1;
}

int Run(const std::string& command, const std::vector<std::string>& args) {
  if (command == "generate") return thetaserve::server::RunGenerate(args);
  if (command == "serve") return thetaserve::server::RunServe(args);
  if (command == "client") return thetaserve::server::RunClient(args);
  if (command == "status") return thetaserve::server::RunStatus(args);
  if (command == "health") return thetaserve::server::RunHealth(args);
  if (command == "calibrate") return thetaserve::server::RunCalibrate(args);
  if (command == "eval") return thetaserve::server::RunEval(args);
  std::fprintf(stderr, "thetaserve: unknown command '%s'\n", command.c_str());
  PrintUsage(stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return 2;
  }
  if (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    PrintUsage(stdout);
    return 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("thetaserve %s\nbackends: cpu%s\n", THETASERVE_VERSION,
                THETASERVE_HAVE_CUDA ? ", cuda (" THETASERVE_CUDA_BUILD ")" : "");
    return 0;
  }
  const std::string command = argv[1];
  return Finished(command, Run(command, std::vector<std::string>(argv + 2, argv + argc)));
}
