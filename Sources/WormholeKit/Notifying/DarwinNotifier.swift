#if canImport(Darwin)
import Darwin
import Dispatch
import Synchronization

/// The notifier on Apple platforms: Darwin notifications (`notify(3)`), as MMWormhole uses.
///
/// Names are namespaced as `PREFIX.NAME`, where the prefix is the App Group identifier and the optional directory,
/// so two wormholes in different groups or directories never wake each other.
///
/// This file is compiled only on Apple platforms, which this project's CI (Linux) cannot build; it is kept to
/// the few calls of `notify(3)`.
public final class DarwinNotifier: Notifier {
    /// The prefix put before every name.
    public let prefix: String
    private let queue = DispatchQueue(label: "wormhole.darwin-notifier")

    /// Creates a notifier whose names start with `prefix`.
    public init(prefix: String) { self.prefix = prefix }

    public func post(_ name: String) throws(WormholeError) {
        let status = notify_post(prefix + "." + name)
        guard status == NOTIFY_STATUS_OK else {
            throw WormholeError(.notifierUnavailable, "notify_post failed with status \(status).")
        }
    }

    public func observe(
        _ name: String,
        handler: @escaping @Sendable () -> Void
    ) throws(WormholeError) -> NotifierObservation {
        var token: Int32 = 0
        let status = notify_register_dispatch(prefix + "." + name, &token, queue) { _ in handler() }
        guard status == NOTIFY_STATUS_OK else {
            throw WormholeError(.notifierUnavailable, "notify_register_dispatch failed with status \(status).")
        }
        let registered = token
        return NotifierObservation { _ = notify_cancel(registered) }
    }
}
#endif
