#if canImport(Darwin)
/// A notifier of Darwin notifications (`notify(3)`) under a prefix of your choice, as MMWormhole posts them.
///
/// A wormhole on a directory does not need it: on Apple platforms its ``DirectoryNotifier`` posts and observes Darwin
/// notifications named by the directory's resolved path, so that every process of the directory meets, whatever
/// path or App Group identifier it was given. Use this one to wake, or be woken by, processes that post names of
/// their own, such as an app that still runs MMWormhole (`PREFIX.NAME`, where MMWormhole's prefix is empty and its
/// names are identifiers).
///
/// Observations keep the ``Notifier`` contract: each has a queue of its own, so a slow handler holds up nobody else,
/// and no call starts after ``NotifierObservation/cancel()`` returns.
///
/// This file is compiled only on Apple platforms, which this project's machines cannot build; its calls were read
/// against Libnotify's `notify.h` (see ARCHITECTURE.md, "Apple platforms").
public final class DarwinNotifier: Notifier {
    /// The prefix put before every name, followed by a dot (none when empty).
    public let prefix: String

    /// Creates a notifier whose names start with `prefix` and a dot; with an empty prefix, names are posted as given.
    public init(prefix: String) { self.prefix = prefix }

    private func fullName(_ name: String) -> String { prefix.isEmpty ? name : prefix + "." + name }

    public func post(_ name: String) throws(WormholeError) {
        try DarwinNotifications.post(fullName(name))
    }

    public func observe(
        _ name: String,
        handler: @escaping @Sendable () -> Void
    ) throws(WormholeError) -> NotifierObservation {
        try DarwinNotifications.observe(fullName(name), handler: handler)
    }
}
#endif
