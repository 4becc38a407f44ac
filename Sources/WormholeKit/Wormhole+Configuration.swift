import Foundation
import Logging

extension Wormhole {
    /// How a wormhole made on a directory stores messages and wakes listeners.
    public struct Configuration: Sendable {
        /// Whether operations take a directory-wide lock (see ``CoordinatedFileTransiting``).
        public enum Coordination: Sendable, Hashable {
            /// Each mailbox on its own: the fastest (``FileTransiting``).
            case none
            /// Writers serialised and readers kept out of half-done clearing (``CoordinatedFileTransiting``).
            case coordinated
        }

        /// The default sender: the process name and id, as `name[pid]`.
        public static var defaultSender: String { "\(ProcessFacts.processName)[\(ProcessFacts.processID)]" }

        /// Whether operations take a directory-wide lock; ``Coordination/none`` by default.
        public var coordination: Coordination
        /// How listeners learn of new messages on Linux; inotify with a polling fallback by default.
        public var notification: DirectoryNotifier.Strategy
        /// File modes, `fsync` and the size limit.
        public var fileOptions: FileTransiting.Options
        /// How messages are encoded; JSON by default.
        public var coder: any MessageCoder
        /// The sender recorded with each message; ``defaultSender`` by default.
        public var sender: String
        /// Where warnings go (for example, falling back to polling).
        public var logger: Logger

        /// Creates a configuration; every parameter has the default described on its property.
        public init(
            coordination: Coordination = .none,
            notification: DirectoryNotifier.Strategy = .automatic,
            fileOptions: FileTransiting.Options = .init(),
            coder: any MessageCoder = JSONMessageCoder(),
            sender: String = Configuration.defaultSender,
            logger: Logger = Logger(label: "wormhole")
        ) {
            self.coordination = coordination
            self.notification = notification
            self.fileOptions = fileOptions
            self.coder = coder
            self.sender = sender
            self.logger = logger
        }
    }
}
