// ThreadSanitizer annotations for Debian's prebuilt Abseil synchronization primitives, linked only
// into the TSan build of the batcher test (batcher_tsan_test).
//
// Why: Debian's libabsl_synchronization.so is not built with -fsanitize=thread, so its
// ABSL_TSAN_MUTEX_* hooks are compiled out and absl::Mutex locks through raw atomics and futexes
// that TSan cannot see. Every access guarded by an absl::Mutex then looks like a race (hundreds of
// false reports on the batcher test). Abseil's sources are not available to rebuild instrumented,
// so this file interposes the public entry points instead: the executable's definitions win over
// the shared library's (ELF symbol interposition; the library itself calls them through its PLT,
// e.g. Notification::Notify -> Mutex::Lock), and each one tells TSan what the real call does (a
// lock, an unlock, a wait that releases and re-acquires) before forwarding to the library's
// function found with dlsym(RTLD_NEXT).
//
// What TSan then checks is exactly what an instrumented Abseil gives it: happens-before through
// the mutex, so an access made outside the lock still races. Accesses made inside Abseil on our
// behalf (Condition callbacks evaluated while locking or waiting) are ignored, as TSan's
// __tsan_mutex_pre_* contract says. Tied to Abseil's ABI (checked below): a library whose inline
// namespace or Notification layout differs fails to build or aborts at start-up, never silently.

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

// The mangled prefix of a (const) member of absl's inline namespace, e.g. "_ZN4absl7debian3".
std::string AbslPrefix(bool is_const) {
#define PRAXIS_STR2(x) #x
#define PRAXIS_STR(x) PRAXIS_STR2(x)
  const std::string ns = PRAXIS_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
#undef PRAXIS_STR
#undef PRAXIS_STR2
  return std::string(is_const ? "_ZNK" : "_ZN") + "4absl" + std::to_string(ns.size()) + ns;
}

// The shared library's definition of the member whose mangled name is absl's inline namespace
// prefix + `rest`; aborts when absent, since a silently unannotated mutex means false reports.
template <typename Fn>
Fn Real(const char* rest, bool is_const = false) {
  const std::string name = AbslPrefix(is_const) + rest;
  void* p = dlsym(RTLD_NEXT, name.c_str());
  if (p == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found in the Abseil libraries\n", name.c_str());
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

// Nesting depth of the wrappers on this thread: a wrapped function that calls another wrapped one
// inside the library (LockWhenWithTimeout -> LockWhenWithDeadline, say) must be annotated once.
thread_local int depth = 0;

// One annotated call: `pre` before, `post` after, both skipped when nested.
class Scope {
 public:
  Scope() : outer_(depth++ == 0) {}
  ~Scope() { --depth; }
  bool outer() const { return outer_; }

 private:
  bool outer_;
};

constexpr unsigned kRead = __tsan_mutex_read_lock;

void PreLock(void* m, unsigned flags, bool outer) {
  if (outer) __tsan_mutex_pre_lock(m, flags);
}
void PostLock(void* m, unsigned flags, bool outer) {
  if (outer) __tsan_mutex_post_lock(m, flags, 0);
}
void PreUnlock(void* m, unsigned flags, bool outer) {
  if (outer) __tsan_mutex_pre_unlock(m, flags);
}
void PostUnlock(void* m, unsigned flags, bool outer) {
  if (outer) __tsan_mutex_post_unlock(m, flags);
}

// A call that returns with `m` held (flags: read or write lock).
template <typename R, typename F>
R Locking(void* m, unsigned flags, F&& call) {
  Scope s;
  PreLock(m, flags, s.outer());
  if constexpr (std::is_void_v<R>) {
    call();
    PostLock(m, flags, s.outer());
  } else {
    R r = call();
    PostLock(m, flags, s.outer());
    return r;
  }
}

// A call made with `m` held that releases it, waits, and returns with it held again: to TSan an
// unlock followed by a lock, so it acquires what other holders released meanwhile.
template <typename R, typename F>
R Waiting(void* m, F&& call) {
  Scope s;
  PreUnlock(m, 0, s.outer());
  if constexpr (std::is_void_v<R>) {
    call();
    PostUnlock(m, 0, s.outer());
    PreLock(m, 0, s.outer());
    PostLock(m, 0, s.outer());
  } else {
    R r = call();
    PostUnlock(m, 0, s.outer());
    PreLock(m, 0, s.outer());
    PostLock(m, 0, s.outer());
    return r;
  }
}

// Notification keeps its flag right after its mutex (Abseil 20220623). Its inline
// HasBeenNotified() is compiled here, instrumented: an acquire load of the flag, which TSan pairs
// with a release on the same address, so Notify releases there. The library's WaitForNotification*
// read the flag uninstrumented when it is already set, so they acquire it explicitly.
static_assert(sizeof(absl::Notification) == sizeof(absl::Mutex) + alignof(absl::Mutex),
              "absl::Notification layout changed: revisit NotifiedFlag");
void* NotifiedFlag(const absl::Notification* n) {
  return const_cast<char*>(reinterpret_cast<const char*>(n)) + sizeof(absl::Mutex);
}

// Passes `notified` through, acquiring what Notify released when it is true.
bool Notified(const absl::Notification* n, bool notified) {
  if (notified) __tsan_acquire(NotifiedFlag(n));
  return notified;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  Locking<void>(this, 0, [&] { real(this); });
}

void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  Locking<void>(this, kRead, [&] { real(this); });
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  Scope s;
  PreLock(this, __tsan_mutex_try_lock, s.outer());
  const bool ok = real(this);
  PostLock(this, __tsan_mutex_try_lock | (ok ? 0 : __tsan_mutex_try_lock_failed), s.outer());
  return ok;
}

bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  Scope s;
  const unsigned flags = kRead | __tsan_mutex_try_lock;
  PreLock(this, flags, s.outer());
  const bool ok = real(this);
  PostLock(this, flags | (ok ? 0 : __tsan_mutex_try_lock_failed), s.outer());
  return ok;
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  Scope s;
  PreUnlock(this, 0, s.outer());
  real(this);
  PostUnlock(this, 0, s.outer());
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  Scope s;
  PreUnlock(this, kRead, s.outer());
  real(this);
  PostUnlock(this, kRead, s.outer());
}

void Mutex::LockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("5Mutex8LockWhenERKNS0_9ConditionE");
  Locking<void>(this, 0, [&] { real(this, cond); });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking<void>(this, kRead, [&] { real(this, cond); });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking<bool>(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking<bool>(this, kRead, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking<bool>(this, 0, [&] { return real(this, cond, deadline); });
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking<bool>(this, kRead, [&] { return real(this, cond, deadline); });
}

void Mutex::Await(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("5Mutex5AwaitERKNS0_9ConditionE");
  Waiting<void>(this, [&] { real(this, cond); });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Waiting<bool>(this, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Waiting<bool>(this, [&] { return real(this, cond, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  Waiting<void>(mu, [&] { real(this, mu); });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Waiting<bool>(mu, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static auto real =
      Real<bool (*)(CondVar*, Mutex*, Time)>("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Waiting<bool>(mu, [&] { return real(this, mu, deadline); });
}

void Notification::Notify() {
  static auto real = Real<void (*)(Notification*)>("12Notification6NotifyEv");
  __tsan_release(NotifiedFlag(this));
  real(this);
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static auto real = Real<bool (*)(const Notification*, Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", /*is_const=*/true);
  return Notified(this, real(this, timeout));
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static auto real = Real<bool (*)(const Notification*, Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", /*is_const=*/true);
  return Notified(this, real(this, deadline));
}

void Notification::WaitForNotification() const {
  static auto real = Real<void (*)(const Notification*)>("12Notification19WaitForNotificationEv",
                                                         /*is_const=*/true);
  real(this);
  Notified(this, true);
}

ABSL_NAMESPACE_END
}  // namespace absl
