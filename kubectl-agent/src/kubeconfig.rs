//! The flags kubectl plugins are expected to take for themselves: kubectl
//! refuses `kubectl --as=x agent ...` (its global flags are not passed to
//! plugins), so the plugin reads `--kubeconfig`, `--context`, `--cluster`,
//! `--user`, `--as`, `--as-group` and `--as-uid` after `agent`, as kubectl
//! would.

use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::error::Error;

/// Where the cluster is and who to be there.
#[derive(Debug, Clone, Default, Args)]
pub struct KubeFlags {
    /// Path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config,
    /// or the in-cluster service account).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The kubeconfig cluster to use.
    #[arg(long, global = true)]
    pub cluster: Option<String>,
    /// The kubeconfig user to use.
    #[arg(long, global = true)]
    pub user: Option<String>,
    /// Act as this user (impersonation; needs the impersonate verb).
    #[arg(long = "as", global = true, value_name = "USER")]
    pub as_user: Option<String>,
    /// Act as a member of this group; repeatable.
    #[arg(long = "as-group", global = true, value_name = "GROUP")]
    pub as_groups: Vec<String>,
    /// Act with this UID.
    #[arg(long = "as-uid", global = true, value_name = "UID")]
    pub as_uid: Option<String>,
}

impl KubeFlags {
    fn options(&self) -> KubeConfigOptions {
        KubeConfigOptions {
            context: self.context.clone(),
            cluster: self.cluster.clone(),
            user: self.user.clone(),
        }
    }

    fn any_option(&self) -> bool {
        self.context.is_some() || self.cluster.is_some() || self.user.is_some()
    }

    /// The client configuration these flags describe.
    pub async fn config(&self) -> Result<Config, Error> {
        let mut cfg = match &self.kubeconfig {
            Some(path) => {
                let kc = Kubeconfig::read_from(path)
                    .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
                Config::from_custom_kubeconfig(kc, &self.options())
                    .await
                    .map_err(|e| Error::Config(e.to_string()))?
            }
            None if self.any_option() => Config::from_kubeconfig(&self.options())
                .await
                .map_err(|e| Error::Config(e.to_string()))?,
            None => Config::infer()
                .await
                .map_err(|e| Error::Config(e.to_string()))?,
        };
        if self.as_user.is_none() && (!self.as_groups.is_empty() || self.as_uid.is_some()) {
            return Err(Error::Config(
                "--as-group and --as-uid need --as (as in kubectl)".into(),
            ));
        }
        if let Some(user) = &self.as_user {
            cfg.auth_info.impersonate = Some(user.clone());
            if !self.as_groups.is_empty() {
                cfg.auth_info.impersonate_groups = Some(self.as_groups.clone());
            }
            cfg.auth_info.impersonate_uid = self.as_uid.clone();
        }
        Ok(cfg)
    }

    /// A client as these flags say.
    pub async fn client(&self) -> Result<Client, Error> {
        Client::try_from(self.config().await?).map_err(|e| Error::Config(e.to_string()))
    }
}
