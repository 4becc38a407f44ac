import Testing

extension Trait where Self == ConditionTrait {
    /// Runs the test on Linux only, and skips it elsewhere with `reason`: for what only Linux has (inotify, `/proc`,
    /// `SOCK_SEQPACKET`, network namespaces, strace). Code that calls a Linux-only function sits under
    /// `#if os(Linux) || os(Android)` as well, which `scripts/check-platform-calls` checks.
    static func linuxOnly(_ reason: Comment) -> Self {
        #if os(Linux) || os(Android)
        .enabled(if: true, reason)
        #else
        .disabled(reason)
        #endif
    }
}
