import Logging
import SystemPackage

/// The one error type that WormholeKit throws.
///
/// Every failure says what went wrong, where, and what to do about it; the cause underneath (an `Errno`, a
/// `DecodingError`) is kept in ``underlyingError``. Match on ``code`` to handle a kind of failure:
///
/// ```swift
/// do {
///     let tap = try wormhole.message(withIdentifier: "button", as: Tap.self)
///     print("tapped", tap?.number ?? 0)
/// } catch {
///     switch error.code {   // error is a WormholeError: every call in the `do` throws one
///     case .decodingFailed: print("the mailbox holds a message of another type")
///     default: throw error
///     }
/// }
/// ```
///
/// New codes may be added in minor releases, so a `switch` over codes should keep a `default` case, as above.
public struct WormholeError: Error, Sendable, CustomStringConvertible {
    /// A stable code for a kind of failure.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Value: Hashable, Sendable {
            case invalidIdentifier, directoryUnavailable, untrustedFile, corruptMessage, truncatedMessage
            case unsupportedFormatVersion, encodingFailed, decodingFailed, messageTooLarge, diskFull
            case ioFailure, notifierUnavailable, notReachable, timedOut, remoteFailure, handlerFailed, unsupported
            case serverUnavailable, serverRejected, notActivated, counterpartUnknown, suspended
        }
        private let value: Value
        private init(_ value: Value) { self.value = value }

        /// The identifier is empty, too long, or holds a character that could escape the directory.
        public static let invalidIdentifier = Code(.invalidIdentifier)
        /// The group or wormhole directory is missing and cannot be created, is not a directory, or is not
        /// writable; on Apple platforms, the App Group container could not be resolved.
        public static let directoryUnavailable = Code(.directoryUnavailable)
        /// A file or directory in the wormhole is a symbolic link, not a regular file, or owned by another user.
        public static let untrustedFile = Code(.untrustedFile)
        /// A message file is damaged: a wrong magic number, or no record whose checksum matches.
        public static let corruptMessage = Code(.corruptMessage)
        /// A message file is shorter than its header says.
        public static let truncatedMessage = Code(.truncatedMessage)
        /// A message file was written in a format version this build does not read.
        public static let unsupportedFormatVersion = Code(.unsupportedFormatVersion)
        /// The message could not be encoded.
        public static let encodingFailed = Code(.encodingFailed)
        /// The message was read but could not be decoded as the requested type.
        public static let decodingFailed = Code(.decodingFailed)
        /// The message is larger than the transiting accepts.
        public static let messageTooLarge = Code(.messageTooLarge)
        /// The file system is full (or over quota); the previous message is intact.
        public static let diskFull = Code(.diskFull)
        /// Another file-system call failed; ``WormholeError/underlyingError`` holds its `Errno`.
        public static let ioFailure = Code(.ioFailure)
        /// Change notifications could not be set up.
        public static let notifierUnavailable = Code(.notifierUnavailable)
        /// No process is listening for live messages or requests of this identifier right now.
        public static let notReachable = Code(.notReachable)
        /// A request got no reply within its time-out.
        public static let timedOut = Code(.timedOut)
        /// The responder threw while handling the request, or its process ended before replying; the message says
        /// which.
        public static let remoteFailure = Code(.remoteFailure)
        /// A handler of yours (a listener, consumer, observer, responder or receiver) threw; its error is the
        /// ``WormholeError/underlyingError``, and the message says what happened to the message it was handling.
        public static let handlerFailed = Code(.handlerFailed)
        /// The wormhole's engine does not offer this mode (a wormhole made from a custom transiting has only
        /// mailboxes).
        public static let unsupported = Code(.unsupported)
        /// The engine's server (PostgreSQL) could not be reached, refused the credentials, or the connection dropped
        /// during the call; a write that failed this way may or may not have happened. The message names the server
        /// (never its password) and the cause.
        public static let serverUnavailable = Code(.serverUnavailable)
        /// The engine's server refused a statement: the schema is missing or older than this build (run
        /// `wormhole postgres setup`), or the role may not use this group.
        public static let serverRejected = Code(.serverRejected)
        /// The ``WormholeSession`` is not activated: call ``WormholeSession/activate()`` before sending.
        public static let notActivated = Code(.notActivated)
        /// The session's counterpart has never activated a session with this one, so a live message has nobody to
        /// go to; queued modes (context, user info, files) wait for it instead.
        public static let counterpartUnknown = Code(.counterpartUnknown)
        /// This process's wormholes are suspended (``Wormhole/suspend()``, or on Apple platforms the app went to the
        /// background while `Wormhole.followApplicationLifecycle()` followed it): the call would have taken a file
        /// lock, which iOS does not allow a suspended app in a shared container, so it did nothing. Try again after
        /// ``Wormhole/resume()``.
        public static let suspended = Code(.suspended)

        public var description: String {
            switch value {
            case .invalidIdentifier: "invalid identifier"
            case .directoryUnavailable: "directory unavailable"
            case .untrustedFile: "untrusted file"
            case .corruptMessage: "corrupt message"
            case .truncatedMessage: "truncated message"
            case .unsupportedFormatVersion: "unsupported format version"
            case .encodingFailed: "encoding failed"
            case .decodingFailed: "decoding failed"
            case .messageTooLarge: "message too large"
            case .diskFull: "disk full"
            case .ioFailure: "I/O failure"
            case .notifierUnavailable: "notifier unavailable"
            case .notReachable: "not reachable"
            case .timedOut: "timed out"
            case .remoteFailure: "remote failure"
            case .handlerFailed: "handler failed"
            case .unsupported: "unsupported"
            case .serverUnavailable: "server unavailable"
            case .serverRejected: "server rejected"
            case .notActivated: "not activated"
            case .counterpartUnknown: "counterpart unknown"
            case .suspended: "suspended"
            }
        }
    }

    /// The kind of failure.
    public var code: Code
    /// What went wrong and what to do, in a sentence or two.
    public var message: String
    /// The message identifier involved, if any.
    public var identifier: String?
    /// The file or directory involved, if any.
    public var path: String?
    /// The error underneath: an `Errno` for a failed system call, a `DecodingError` for a decoding failure.
    public var underlyingError: (any Error & Sendable)?
    /// Where the error was thrown, for bug reports.
    public var source: (file: String, line: Int)

    /// Creates an error; WormholeKit's own code and custom transitings use it alike.
    public init(
        _ code: Code,
        _ message: String,
        identifier: String? = nil,
        path: String? = nil,
        underlyingError: (any Error & Sendable)? = nil,
        file: String = #fileID,
        line: Int = #line
    ) {
        self.code = code
        self.message = message
        self.identifier = identifier
        self.path = path
        self.underlyingError = underlyingError
        self.source = (file, line)
    }

    /// The `Errno` underneath, when a system call failed.
    public var errno: Errno? { underlyingError as? Errno }

    public var description: String {
        var text = "WormholeError(\(code)): \(message)"
        if let identifier { text += " [identifier: \(identifier)]" }
        if let path { text += " [path: \(path)]" }
        if let underlyingError { text += " [cause: \(underlyingError)]" }
        return text
    }

    /// The error reported when a handler of the caller's threw.
    ///
    /// - Parameter what: What happened to the message being handled, such as "on the message at offset 12; it stays
    ///   unacknowledged".
    static func handlerFailed(
        _ error: any Error,
        _ what: String,
        identifier: String?,
        file: String = #fileID,
        line: Int = #line
    ) -> WormholeError {
        WormholeError(
            .handlerFailed,
            "The handler threw \(what): \(error).",
            identifier: identifier,
            underlyingError: error,
            file: file,
            line: line
        )
    }

    /// Maps a failed file-system call to an error, choosing the code from the errno.
    static func fileSystem(
        _ errno: Errno,
        _ action: String,
        identifier: String? = nil,
        path: String?,
        file: String = #fileID,
        line: Int = #line
    ) -> WormholeError {
        let code: Code
        let advice: String
        switch errno {
        case .noSpace, .diskQuotaExceeded:
            code = .diskFull
            advice = "the file system is full; free some space and try again (the previous message is intact)"
        case .tooManySymbolicLinkLevels:
            code = .untrustedFile
            advice = "the path is a symbolic link, which a wormhole never follows; remove the link"
        case .permissionDenied, .notPermitted, .readOnlyFileSystem:
            code = .directoryUnavailable
            advice = "permission denied; check the owner and mode of the wormhole directory"
        default:
            code = .ioFailure
            advice = "\(errno)"
        }
        return WormholeError(
            code,
            "Could not \(action): \(advice).",
            identifier: identifier,
            path: path,
            underlyingError: errno,
            file: file,
            line: line
        )
    }
}

extension WormholeError.Code {
    /// Lets `catch` clauses match a code directly: `catch WormholeError.Code.diskFull { … }`.
    public static func ~= (code: WormholeError.Code, error: any Error) -> Bool {
        (error as? WormholeError)?.code == code
    }
}
