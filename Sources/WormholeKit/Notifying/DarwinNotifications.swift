#if canImport(Darwin)
import Darwin
import Dispatch
import notify
import Synchronization

/// The calls of `notify(3)` (Libnotify's `notify.h`, which Swift imports as the module `notify`), kept to the three
/// a wormhole needs: ``post(_:)``, ``observe(_:handler:)`` and its cancellation.
///
/// Compiled on Apple platforms only, which this project's machines cannot build: every call here was read against
/// Libnotify's published `notify.h` (ARCHITECTURE.md, "Apple platforms", lists each and where it was checked).
///
/// Each observation has a serial queue of its own, targeting a global queue: a slow handler holds up its own
/// observation only, and calls of one observation never overlap. `notify_cancel` does not promise that a block
/// already submitted to the queue will not run, so a cancelled flag is checked before each call, and cancelling
/// waits (with `sync` on the observation's queue) for a call under way, unless the handler itself cancels.
enum DarwinNotifications {
    /// Posts `name` to every process of the machine that observes it.
    static func post(_ name: String) throws(WormholeError) {
        let status = notify_post(name)
        guard status == UInt32(NOTIFY_STATUS_OK) else {
            throw WormholeError(
                .notifierUnavailable,
                "notify_post failed with status \(status) for \(name); other processes were not woken."
            )
        }
    }

    /// Calls `handler` after each post of `name`, until the observation is cancelled or released.
    static func observe(
        _ name: String,
        handler: @escaping @Sendable () -> Void
    ) throws(WormholeError) -> NotifierObservation {
        let state = ObservationState()
        let queue = DispatchQueue(label: "wormhole.notify", target: .global(qos: .utility))
        queue.setSpecific(key: ownQueue, value: ObjectIdentifier(state))
        var token: Int32 = 0
        let status = notify_register_dispatch(name, &token, queue) { _ in
            if !state.cancelled.load(ordering: .acquiring) { handler() }
        }
        guard status == UInt32(NOTIFY_STATUS_OK) else {
            throw WormholeError(
                .notifierUnavailable,
                "notify_register_dispatch failed with status \(status) for \(name); nothing would wake this observer."
            )
        }
        let registered = token
        return NotifierObservation {
            state.cancelled.store(true, ordering: .releasing)
            _ = notify_cancel(registered)
            // A call under way ends before cancel returns; from inside the handler, it is that call.
            if DispatchQueue.getSpecific(key: ownQueue) != ObjectIdentifier(state) { queue.sync {} }
        }
    }

    /// Tells an observation's queue from every other, so that a handler that cancels its own observation does not
    /// wait for itself.
    private static let ownQueue = DispatchSpecificKey<ObjectIdentifier>()

    private final class ObservationState: Sendable {
        let cancelled = Atomic<Bool>(false)
    }

    /// The name under which a wormhole directory's notification `name` is posted: the directory's resolved path
    /// (``resolvedPath(_:)``, resolved once by the caller, so that `/tmp/x` and `/private/tmp/x`, or an App Group's
    /// identifier and its container's path as a tool is given it, meet) and the name.
    static func name(_ name: String, inResolvedDirectory directory: String) -> String {
        "wormhole:" + directory + ":" + name
    }

    /// The path with every symbolic link and `..` resolved, or as given when it cannot be resolved.
    static func resolvedPath(_ path: String) -> String {
        guard let resolved = realpath(path, nil) else { return path }
        defer { free(resolved) }
        return String(cString: resolved)
    }
}
#endif
