import SiwaDomain
import SiwaWorkers

extension Settings {
    package static let workers = Setting<Int>.integer(
        "SIWA_WORKERS", flag: "workers", .jobs, default: EffectSettings().workers, 1...64,
        help: "effect worker loops in this process",
        docs: "Effect worker loops in this process.")
    package static let jobLease = Setting<Duration>.duration(
        "SIWA_JOB_LEASE", flag: "job-lease", .jobs, default: QueuePolicy().lease,
        help: "how long a claimed delivery stays held without a heartbeat, and an effect batch may sit idle",
        docs: "How long a claimed callback or alert delivery stays held without a heartbeat; and how long an effect batch's transaction may sit idle before PostgreSQL ends it (a stalled worker frees its jobs).")
    package static let jobMaxAttempts = Setting<Int>.integer(
        "SIWA_JOB_MAX_ATTEMPTS", flag: "job-max-attempts", .jobs, default: QueuePolicy().maxAttempts, 1...1000,
        help: "attempts before a job is discarded",
        docs: "Attempts before a job is `discarded`.")
    package static let jobRetention = Setting<Duration>.duration(
        "SIWA_JOB_RETENTION", flag: "job-retention", .jobs, default: QueueUpkeep().retention,
        help: "how long finished jobs are kept",
        docs: "How long finished jobs are kept (attempts are kept in `job_attempts`).")
    package static let jobPollInterval = Setting<Duration>.duration(
        "SIWA_JOB_POLL_INTERVAL", flag: "job-poll-interval", .jobs, default: QueuePolicy().pollInterval,
        help: "idle workers look for jobs this often while no LISTEN wakes them (notify off, or the listener reconnecting)",
        docs: "Idle workers look for jobs this often while no LISTEN wakes them: `SIWA_JOB_NOTIFY=off`, or the listener reconnecting.")
    package static let jobCheckInterval = Setting<Duration>.duration(
        "SIWA_JOB_CHECK_INTERVAL", flag: "job-check-interval", .jobs, default: QueuePolicy().checkInterval, minimum: .milliseconds(100),
        help: "while LISTEN holds, how often one check looks for jobs a lost NOTIFY left",
        docs: "While LISTEN holds, idle workers sleep and one check per process looks for jobs a lost NOTIFY left this often (a retry is checked for when it falls due); one cheap statement each time.")
    package static let jobNotify = Setting<Bool>.boolean(
        "SIWA_JOB_NOTIFY", flag: "job-notify", .jobs, default: QueuePolicy().listen, shownAs: ("on", "off"),
        help: "on|off: LISTEN for enqueue notifications",
        docs: "`off`: poll only (e.g. behind a transaction-mode pooler).")

    static let jobs = [workers.info, jobLease.info, jobMaxAttempts.info, jobRetention.info, jobPollInterval.info, jobCheckInterval.info, jobNotify.info]
}

extension EffectWorkers.Configuration {
    /// The worker loops' (`EffectWorkers` hands each its part): the queue's settings, what effects
    /// do, history's retention, and the delivery lanes' endpoints.
    package init(_ source: SettingSource) throws(ConfigurationError) {
        self.init()
        effects.workers = try source.value(Settings.workers)
        effects.eraseOnDelete = try source.value(Settings.eraseOnDelete)
        queue.lease = try source.value(Settings.jobLease)
        queue.maxAttempts = try source.value(Settings.jobMaxAttempts)
        queue.pollInterval = try source.value(Settings.jobPollInterval)
        queue.checkInterval = try source.value(Settings.jobCheckInterval)
        queue.listen = try source.value(Settings.jobNotify)
        upkeep.retention = try source.value(Settings.jobRetention)
        history = try HistoryPruner.Configuration(source)
        lanes.callbacks = try Callbacks.configured(source)
        lanes.alertSinks = try AlertSinks(source)
    }
}
