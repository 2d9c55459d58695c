// One child process with its stdin and stdout on pipes: read a line with a time bound, write a
// line, wait for its exit with a time bound. Killed (SIGKILL, by its PID) and reaped on destruction
// if it is still running. Used by dma-bench for its target process and by the tests that run the
// examples as separate processes.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

extern char** environ;

namespace dma::tools {

class ChildProcess {
 public:
  /// Starts arguments[0] (a path, or a name looked up in PATH) with the rest as its arguments; throws
  /// std::system_error. With own_process_group the child leaves the terminal's foreground group, so a Ctrl-C reaches
  /// only this process, which then ends the child itself.
  explicit ChildProcess(std::vector<std::string> arguments, bool own_process_group = false) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
    if (pipe2(out, O_CLOEXEC) != 0) {
      const int error = errno;
      close(in[0]), close(in[1]);
      throw std::system_error(error, std::generic_category(), "pipe");
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    if (own_process_group) {
      posix_spawnattr_setpgroup(&attributes, 0);
      posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    }
    std::vector<char*> argv;
    for (auto& a : arguments)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawnp(&pid_, argv[0], &actions, &attributes, argv.data(), environ);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    in_ = in[1];
    out_ = out[0];
    if (rc != 0) {
      pid_ = -1;
      throw std::system_error(rc, std::generic_category(), "cannot start " + arguments[0]);
    }
  }
  ~ChildProcess() {
    close_input();
    kill_now();
    if (out_ >= 0) close(out_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const noexcept { return pid_; }

  /// Sends a signal by PID (SIGSTOP, SIGCONT, ...) while the child runs.
  void signal(int number) const noexcept {
    if (pid_ > 0) ::kill(pid_, number);
  }

  /// SIGKILL and reap, if still running.
  void kill_now() noexcept {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  /// Closes the child's stdin: it sees end of input.
  void close_input() noexcept {
    if (in_ >= 0) close(in_);
    in_ = -1;
  }

  /// Writes text and a newline to the child's stdin; false if the child is gone.
  bool write_line(std::string_view text) {
    std::string line(text);
    line += '\n';
    std::size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = write(in_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }

  /// The next line of stdout without its newline, or "" when none arrives within the bound or
  /// the child closed its stdout.
  std::string line(std::chrono::milliseconds bound = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (;;) {
      if (auto at = buffer_.find('\n'); at != std::string::npos) {
        std::string result = buffer_.substr(0, at);
        buffer_.erase(0, at + 1);
        if (!result.empty() && result.back() == '\r') result.pop_back();
        return result;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return {};
      pollfd p{out_, POLLIN, 0};
      const int ready = poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return {};
      char chunk[512];
      const ssize_t n = read(out_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return {};
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  /// The exit status (128 + signal when killed by one), or -1 if it does not exit within the bound.
  int wait(std::chrono::milliseconds bound = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (pid_ > 0 && std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  std::string buffer_;
};

}  // namespace dma::tools
