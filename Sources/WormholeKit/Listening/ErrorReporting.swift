import Logging
import SystemPackage

/// Where errors go that happen while listening.
enum ErrorReporting {
    /// Hands `error` to the caller's handler, or logs it when there is none: an error is never dropped.
    static func report(
        _ error: WormholeError,
        to handler: (@Sendable (WormholeError) -> Void)?,
        logger: Logger,
        context: String
    ) {
        if let handler {
            handler(error)
        } else {
            logger.error(
                "A wormhole listener could not deliver (pass an errorHandler to handle this)",
                metadata: ["listening": "\(context)", "error": "\(error)"]
            )
        }
    }
}
