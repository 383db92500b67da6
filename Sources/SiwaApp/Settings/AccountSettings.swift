import SiwaWorkers

extension Settings {
    package static let eraseOnDelete = Setting<Bool>.boolean(
        "SIWA_ERASE_ON_DELETE", flag: "erase-on-delete", .accounts, default: EffectSettings().eraseOnDelete, shownAs: ("true", "false"),
        help: "true|false: erase a deleted account's email everywhere",
        docs: "Erase a deleted account's email everywhere.")
    package static let sessionTTL = Setting<Duration>.duration(
        "SIWA_SESSION_TTL", flag: "session-ttl", .accounts, default: .seconds(30 * 86_400),
        help: "lifetime of a session created without expires_at",
        docs: "Lifetime of a session created without `expires_at`.")

    static let accounts = [eraseOnDelete.info, sessionTTL.info]
}
