/// The error type that shared stores throw: `SharedStore` (SQLite, in `WormholeStore`) and `PostgresStore`
/// (in `WormholePostgres`).
///
/// As ``WormholeError`` does for mailboxes: a stable ``code``, a message that says what went wrong and
/// what to do, and the cause underneath (GRDB's `DatabaseError`, a ``WormholeError`` of the PostgreSQL engine) in
/// ``underlyingError``.
public struct StoreError: Error, Sendable, CustomStringConvertible {
    /// A stable code for a kind of failure.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Value: Hashable, Sendable {
            case unavailable, migrationFailed, busy, corruptHistory, database, notification, handlerFailed, suspended
        }
        private let value: Value
        private init(_ value: Value) { self.value = value }

        /// The database could not be opened or created (a bad path, a missing directory, permissions), or its server
        /// could not be reached.
        public static let unavailable = Code(.unavailable)
        /// A migration failed. SQLite keeps the migrations applied before it; PostgreSQL keeps none of that opening's.
        public static let migrationFailed = Code(.migrationFailed)
        /// Another process held the database longer than the busy timeout (SQLite's `SQLITE_BUSY`), or PostgreSQL
        /// ended the transaction as a deadlock or a serialization failure: running it again may succeed.
        public static let busy = Code(.busy)
        /// A history row cannot be read (a malformed primary key or operation); the other rows are delivered.
        public static let corruptHistory = Code(.corruptHistory)
        /// Another database error: ``StoreError/underlyingError`` holds GRDB's `DatabaseError`, or the PostgreSQL
        /// engine's ``WormholeError`` with the server's message.
        public static let database = Code(.database)
        /// Other processes could not be notified, or notifications could not be observed.
        public static let notification = Code(.notification)
        /// A closure or handler of yours threw; its error is the ``StoreError/underlyingError`` (a write is rolled
        /// back, a remote change stays unacknowledged).
        public static let handlerFailed = Code(.handlerFailed)
        /// This process's wormholes are suspended (``Wormhole/suspend()``): a `SharedStore` takes no lock on its
        /// database then, so the write (or a read that needed a lock) was not made. Try again after
        /// ``Wormhole/resume()``.
        public static let suspended = Code(.suspended)

        public var description: String {
            switch value {
            case .unavailable: "store unavailable"
            case .migrationFailed: "migration failed"
            case .busy: "database busy"
            case .corruptHistory: "corrupt history"
            case .database: "database error"
            case .notification: "notification failed"
            case .handlerFailed: "handler failed"
            case .suspended: "suspended"
            }
        }
    }

    /// The kind of failure.
    public var code: Code
    /// What went wrong and what to do, in a sentence or two.
    public var message: String
    /// The database file involved, or for PostgreSQL the server and the store's name (never a password).
    public var path: String?
    /// The error underneath.
    public var underlyingError: (any Error)?

    /// Creates an error.
    public init(_ code: Code, _ message: String, path: String? = nil, underlyingError: (any Error)? = nil) {
        self.code = code
        self.message = message
        self.path = path
        self.underlyingError = underlyingError
    }

    public var description: String {
        var text = "StoreError(\(code)): \(message)"
        if let path { text += " [path: \(path)]" }
        if let underlyingError { text += " [cause: \(underlyingError)]" }
        return text
    }
}

extension StoreError.Code {
    /// Lets `catch` clauses match a code directly: `catch StoreError.Code.busy { … }`.
    public static func ~= (code: StoreError.Code, error: any Error) -> Bool {
        (error as? StoreError)?.code == code
    }
}
