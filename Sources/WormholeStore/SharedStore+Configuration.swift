import Foundation
import GRDB
import Logging
import WormholeKit

extension SharedStore {
    /// How a shared store is opened and how it shares.
    public struct Configuration: Sendable {
        /// Who this process is in the history, so that others know who changed what and a process can skip its own
        /// writes: a name per target, such as `app` or `widget`. By default the process name.
        public var author: String
        /// How long a write waits for another process's write before failing with `StoreError.Code.busy`;
        /// 5 seconds by default.
        public var busyTimeout: Duration
        /// How long history is kept for a consumer that never comes back; 7 days by default.
        public var historyMaximumAge: Duration
        /// Tables whose changes are not recorded nor notified (caches, scratch tables).
        public var untrackedTables: Set<String>
        /// Whether this process's GRDB observations fire after other processes' commits; on by default.
        public var observesRemoteChanges: Bool
        /// How other processes' commits are noticed on Linux.
        public var notification: DirectoryNotifier.Strategy
        /// GRDB's configuration, for your own settings (`prepareDatabase`, tracing…); the store sets its busy mode
        /// and WAL journal mode.
        public var databaseConfiguration: GRDB.Configuration
        /// Where warnings go.
        public var logger: Logger

        /// Creates a configuration; every parameter has the default described on its property.
        public init(
            author: String = ProcessInfo.processInfo.processName,
            busyTimeout: Duration = .seconds(5),
            historyMaximumAge: Duration = .seconds(7 * 24 * 3600),
            untrackedTables: Set<String> = [],
            observesRemoteChanges: Bool = true,
            notification: DirectoryNotifier.Strategy = .automatic,
            databaseConfiguration: GRDB.Configuration = GRDB.Configuration(),
            logger: Logger = Logger(label: "wormhole.store")
        ) {
            self.author = author
            self.busyTimeout = busyTimeout
            self.historyMaximumAge = historyMaximumAge
            self.untrackedTables = untrackedTables
            self.observesRemoteChanges = observesRemoteChanges
            self.notification = notification
            self.databaseConfiguration = databaseConfiguration
            self.logger = logger
        }
    }
}
